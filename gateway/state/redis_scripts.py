"""The Redis side of shared state: key names and the Lua scripts, one round trip each.

Keys (``P`` is the prefix, ``cachegate`` by default):

- ``P:lease:{team}``: hash, one field per replica holding leases of the team (value: how many),
  plus ``~e``: the epoch the hash belongs to, and ``~w`` while some replica has a request refused
  for lack of a slot (a release publishes a wake-up only then, and clears it). A replica's leases
  live as long as its heartbeat (``P:replicas``): renewing all it holds is one heartbeat.
- ``P:leases``: set of the lease hashes (where a dead replica's counts are dropped from).
- ``P:replicas``: sorted set, replica id -> Redis time of its last heartbeat. A replica silent
  longer than the lease TTL is dead: the next heartbeat of another drops it and its leases.
- ``P:epoch``: a random token written by the first replica that finds Redis empty. A flush or a
  restart without persistence loses it: every replica sees the change on its next call and
  re-registers what it holds (fencing: no lease is taken in a Redis whose epoch is not the one
  the replica has registered its leases in).
- ``P:teams``: hash, team -> ``{"fields": {...}, "v": version}``: runtime limits (admin API).
- ``P:events``: pub/sub channel: ``release`` (someone waits for a slot) and ``limits`` events.
"""

from __future__ import annotations

import orjson
import redis

# KEYS: lease, epoch, events, lease index. ARGV: limit, replica, epoch, deferred releases, event.
# Common path: HGETALL and, when the count changes, HINCRBY. -> {1 granted | 0 refused | -1 other
# epoch, the hash as read} (what the other replicas held: if Redis fails, their excess over their
# share is kept out of this replica's share).
ACQUIRE = """
local h = redis.call('HGETALL', KEYS[1])
local total, e, w = 0, false, false
for i = 1, #h, 2 do
  if h[i] == '~e' then e = h[i + 1] elseif h[i] == '~w' then w = true else total = total + tonumber(h[i + 1]) end
end
if not e then
  e = redis.call('GET', KEYS[2])
  if e ~= ARGV[3] then return {-1, h} end
  redis.call('HSET', KEYS[1], '~e', e)
  redis.call('SADD', KEYS[4], KEYS[1])
elseif e ~= ARGV[3] then
  return {-1, h}
end
local p = tonumber(ARGV[4])
local ok = total - p < tonumber(ARGV[1])
local net = (ok and 1 or 0) - p
if net ~= 0 then
  if redis.call('HINCRBY', KEYS[1], ARGV[2], net) <= 0 then redis.call('HDEL', KEYS[1], ARGV[2]) end
end
if not ok then
  if not w then redis.call('HSET', KEYS[1], '~w', '1') end
  return {0, h}
end
if net < 0 and w then
  redis.call('HDEL', KEYS[1], '~w')
  redis.call('PUBLISH', KEYS[3], ARGV[5])
end
return {1, h}
"""

# KEYS: events, then the lease hash per team. ARGV: replica, then (count, event) per team.
# A release wakes the waiters (and clears the mark they left) only if someone waits.
RELEASE = """
for i = 2, #KEYS do
  local j = 2 * i - 2
  if redis.call('HINCRBY', KEYS[i], ARGV[1], -tonumber(ARGV[j])) <= 0 then redis.call('HDEL', KEYS[i], ARGV[1]) end
  if redis.call('HDEL', KEYS[i], '~w') == 1 then redis.call('PUBLISH', KEYS[1], ARGV[j + 1]) end
end
return 1
"""

# KEYS: replicas, epoch, lease index. ARGV: replica, epoch, lease ttl s, fresh s.
# -> {1, live replicas, replicas heard from within fresh s} | {-1} epoch changed | {-2} this replica
# had been dropped (its leases with it). Replicas silent past the TTL are dropped with their leases.
HEARTBEAT = """
local now = redis.call('TIME')
local t = tonumber(now[1]) + tonumber(now[2]) / 1e6
if redis.call('GET', KEYS[2]) ~= ARGV[2] then return {-1, 0, 0} end
if redis.call('ZADD', KEYS[1], 'XX', 'CH', t, ARGV[1]) == 0 then return {-2, 0, 0} end
local dead = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. (t - tonumber(ARGV[3])))
if #dead > 0 then
  for _, k in ipairs(redis.call('SMEMBERS', KEYS[3])) do redis.call('HDEL', k, unpack(dead)) end
  redis.call('ZREM', KEYS[1], unpack(dead))
end
return {1, redis.call('ZCARD', KEYS[1]), redis.call('ZCOUNT', KEYS[1], t - tonumber(ARGV[4]), '+inf')}
"""

# KEYS: replicas, epoch, lease index, lease per team. ARGV: replica, candidate epoch, lease ttl s, fresh s,
# count per team. Writes what this replica holds as absolute counts, so it is right whatever Redis
# lost. -> {epoch, live replicas, replicas heard from within fresh s}
REGISTER = """
local now = redis.call('TIME')
local t = tonumber(now[1]) + tonumber(now[2]) / 1e6
local e = redis.call('GET', KEYS[2])
if not e then
  e = ARGV[2]
  redis.call('SET', KEYS[2], e)
end
redis.call('ZADD', KEYS[1], t, ARGV[1])
for i = 4, #KEYS do
  local n = tonumber(ARGV[i + 1])
  if n > 0 then
    redis.call('HSET', KEYS[i], ARGV[1], n, '~e', e)
    redis.call('SADD', KEYS[3], KEYS[i])
  else
    redis.call('HDEL', KEYS[i], ARGV[1])
  end
end
local live = redis.call('ZCOUNT', KEYS[1], t - tonumber(ARGV[3]), '+inf')
return {e, live, redis.call('ZCOUNT', KEYS[1], t - tonumber(ARGV[4]), '+inf')}
"""

# KEYS: teams. ARGV: (team, json) pairs. Keeps the newer version of each team's runtime limits.
MERGE_LIMITS = """
local n = 0
for i = 1, #ARGV, 2 do
  local cur = redis.call('HGET', KEYS[1], ARGV[i])
  local v = cjson.decode(ARGV[i + 1])['v']
  local old = cur and (cjson.decode(cur)['v'] or 0) or -1
  if old < v then
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
    n = n + 1
  end
end
return n
"""

# KEYS: replicas, lease per team. ARGV: replica. A replica that stops gives everything back.
LEAVE = """
redis.call('ZREM', KEYS[1], ARGV[1])
for i = 2, #KEYS do redis.call('HDEL', KEYS[i], ARGV[1]) end
return 1
"""


def text(value: bytes | str) -> str:
    """A Redis reply as text (redis-py answers bytes unless told to decode)."""
    return value.decode() if isinstance(value, bytes) else value


def decode_limits(raw: bytes | str) -> tuple[dict[str, object], int]:
    """A stored team entry: ``(fields, version)``; entries written before versions count as 0."""
    data = orjson.loads(raw)
    if isinstance(data, dict) and "fields" in data and "v" in data:
        return dict(data["fields"]), int(data["v"])
    return dict(data), 0


def live_leases(url: str, prefix: str = "cachegate", ttl_s: float = 10.0) -> dict[str, int]:
    """Leases held per team by live replicas (heartbeat within ``ttl_s``): for tests and the chaos
    suite ("leases left at the end"). Synchronous; opens and closes its own connection."""
    client = redis.Redis.from_url(url, socket_timeout=2.0, socket_connect_timeout=2.0, decode_responses=True)
    try:
        sec, usec = client.time()
        now = sec + usec / 1e6
        live = set(client.zrangebyscore(f"{prefix}:replicas", now - ttl_s, "+inf"))
        out: dict[str, int] = {}
        for key in client.scan_iter(match=f"{prefix}:lease:*", count=1000):
            team = str(key)[len(prefix) + len(":lease:") :]
            fields: dict[str, str] = client.hgetall(key)  # type: ignore[assignment]
            count = sum(int(v) for k, v in fields.items() if k in live)
            if count:
                out[team] = count
        return out
    finally:
        client.close()
