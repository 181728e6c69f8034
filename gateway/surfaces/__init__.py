"""The client APIs: the plug-in interface a surface implements (``base``), chat and completions
(``chat``, ``openai``), Responses (``responses``, ``response_store``) and Messages (``messages``), their
relays (``native_relay``, ``translated_relay``), the translations between them (``translate``) and the
read-only client routes (``client_routes``). Imports ``relay``, ``http``, ``observability``, ``config``."""
