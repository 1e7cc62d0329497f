"""A process tree that leaves its parent's group, for the tests of the service guard.

``python -c TREE PIDFILE`` starts ``DAEMON`` in a session of its own and sleeps. The daemon
forks twice, calls ``setsid`` and ignores SIGTERM (only SIGKILL ends it), as Spark's scripts
and Airflow's children may; its pid goes to ``PIDFILE`` (written whole, by a rename).
"""

__all__ = ["DAEMON", "TREE"]

DAEMON = """
import os, signal, sys, time
first = os.fork()
if first == 0:
    os.setsid()
    if os.fork() == 0:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        with open(sys.argv[1] + ".tmp", "w") as out:
            out.write(str(os.getpid()))
        os.rename(sys.argv[1] + ".tmp", sys.argv[1])
        time.sleep(1000)
    os._exit(0)
os.waitpid(first, 0)
time.sleep(1000)
"""
TREE = f"""
import subprocess, sys, time
subprocess.Popen([sys.executable, "-c", {DAEMON!r}, sys.argv[1]], start_new_session=True)
time.sleep(1000)
"""
