"""The one-shot `ninfer` command: one conversation through the server's engine and frontend, the
answer on stdout and everything else (loading, reasoning, timing, speculation) on stderr."""
