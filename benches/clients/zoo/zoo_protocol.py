"""The app zoo's line protocol, shared by its Python applications.

The application prints `ready N` once its schema is in place and its pool holds N open
connections. Each `step` line on stdin runs the next step of the flow, whose output lines are
printed as `out ...`, then `ok`; `quit` closes the pool and prints `done`.
"""

import sys


def serve(pool_size, steps, close):
    """Answers the harness's commands: `steps` are functions that return output lines."""
    print(f"ready {pool_size}", flush=True)
    done = 0
    for line in sys.stdin:
        command = line.strip()
        if command == "quit":
            break
        if command != "step" or done == len(steps):
            sys.exit(f"unexpected command {command!r} after {done} steps")
        for out in steps[done]():
            print("out", out, flush=True)
        done += 1
        print("ok", flush=True)
    close()
    print("done", flush=True)
