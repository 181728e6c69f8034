import json, sys, time
from concurrent.futures import ProcessPoolExecutor
from loadtest.simulate import SimConfig, build_core, run_one
def job(a):
    tag, kw, conf = a
    cfg = SimConfig(**kw)
    t=time.perf_counter()
    r = run_one(cfg, core=build_core(cfg.policy, cfg.admission, None, conf))
    return tag, {k: r[k] for k in ("total_tpm","ttft_p50_s","ttft_p95_s","max_wait_s","starved","completed_rpm","cache_hit_rate")}, time.perf_counter()-t
which = sys.argv[1]; conf = json.loads(sys.argv[2]) if len(sys.argv) > 2 else None
jobs=[]
if which in ("hc","all"):
    for n in (8,16,32,48,64):
        for pol in ("direct","gateway"):
            jobs.append((f"hc/{pol}/{n}", dict(profile="b300-tp8-fp8-hicache", policy=pol, conversations=n), conf if pol=="gateway" else None))
if which in ("dp","all"):
    for n in [int(x) for x in (sys.argv[3] if len(sys.argv)>3 else "8,16,32,48,64,96,128").split(",")]:
        for pol in (sys.argv[4] if len(sys.argv)>4 else "direct,gateway,sglang-cache-aware").split(","):
            jobs.append((f"dp/{pol}/{n}", dict(profile="b300-dp8-fp8-cp", policy=pol, conversations=n), conf if pol=="gateway" else None))
with ProcessPoolExecutor(2) as ex:
    for tag, r, w in ex.map(job, jobs):
        print(tag, f"{r['total_tpm']/1e6:.2f}M p50={r['ttft_p50_s']} p95={r['ttft_p95_s']} maxw={r['max_wait_s']} starved={r['starved']} hit={r['cache_hit_rate']} ({w:.1f}s)", flush=True)
