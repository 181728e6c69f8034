"""The configuration: the file's schema and loader (``schema``), the policies' parameters as config
sections (``params``), the HTTP server's limits (``server``) and the process's log layout (``logsetup``).
Imports ``backends.config`` and ``policies``; nothing else of the gateway."""
