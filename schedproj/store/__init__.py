"""The Redis side: the protocol (every key, counter field, limit and record version), the
connection, the Lua scripts, the lane store and the heavy lease. Imports the core, never the
Celery side."""
