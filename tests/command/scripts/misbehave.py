"""A command that misbehaves as its first argument says:

- "hang": starts a child process (its own grandchild of the rollout), writes both pids to $PID_FILE, sleeps forever;
- "crash": prints a traceback-like line to stderr and exits with status 3;
- "print": prints its second argument as its last line (a reward that may not be a number) and exits 0;
- "escape": starts a child in a session of its own (out of the rollout's process group, as a daemon does), whose
  command line ends with its second argument, then sleeps forever.
"""

import os
import subprocess
import sys
import time

mode = sys.argv[1]
if mode == "hang":
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    with open(os.environ["PID_FILE"], "w") as file:
        file.write(f"{os.getpid()} {child.pid}")
    print("hanging now", flush=True)
    time.sleep(3600)
elif mode == "escape":
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)", sys.argv[2]], start_new_session=True)
    print("escaped", flush=True)
    time.sleep(3600)
elif mode == "crash":
    print("starting", flush=True)
    print("RuntimeError: the agent broke on purpose", file=sys.stderr)
    sys.exit(3)
elif mode == "print":
    print("some chatter")
    print(sys.argv[2])
