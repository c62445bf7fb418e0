"""Operations, above the Celery side: the command line, the app factory and the starvation
watchdog lane. Imports any layer below it; nothing in the library imports it."""
