# Reference only: `python -m ninfer.service` configures gunicorn itself (BaseApplication) and
# never reads a gunicorn.conf.py. These are the values it sets, for operators reading them.
workers = 1  # one resident engine per process; never more
worker_class = "gthread"
threads = 2 + 16 + 8  # max_concurrency + max_pending_requests + headroom (one thread per open stream)
preload_app = False  # the engine (and CUDA) must start in the worker, never in the master
timeout = 60  # heartbeat; model load runs on a thread, so it never blocks it
graceful_timeout = 35  # drain bound (30 s) + 5 s
keepalive = 5
max_requests = 0  # a worker restart would reload the model
