"""Writes report.json in its working directory: what it could reach. ``$OUTSIDE`` and ``$HIDDEN`` are directories
outside it (on disk, under /tmp), ``$WATCHER_PID`` the pid of the test that started it."""

import json
import os
import uuid

report = {"home": os.environ["HOME"], "cwd": os.getcwd()}
for name in ("OUTSIDE", "HIDDEN"):
    try:
        with open(os.path.join(os.environ[name], "escaped.txt"), "w") as file:
            file.write("out")
        report[name.lower()] = "written"
    except OSError as exc:
        report[name.lower()] = type(exc).__name__ + ": " + os.strerror(exc.errno or 0)
report["tmp_file"] = f"/tmp/agl-probe-{uuid.uuid4().hex}"
with open(report["tmp_file"], "w") as file:
    file.write("private")
os.makedirs(os.path.join(os.environ["HOME"], ".config", "agent"))
try:
    os.kill(int(os.environ["WATCHER_PID"]), 0)
    report["watcher"] = "visible"
except ProcessLookupError:
    report["watcher"] = "not visible"
report["processes"] = sorted(int(name) for name in os.listdir("/proc") if name.isdigit())
with open("report.json", "w") as file:
    json.dump(report, file)
print(1.0)
