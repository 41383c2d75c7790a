"""The worker's side: the backend contract and the built-in backends, the timing loop, the runner that times a plan
point by point, and the interference guard. Never imports the service, HTTP or the command line
(tests/test_layout.py)."""
