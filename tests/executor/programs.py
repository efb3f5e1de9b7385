"""Programs the executor tests run: a correct pizza solution, a trivial one, and hostile ones."""

from __future__ import annotations

PIZZA_SKLEARN = """
import json
import numpy as np
import pandas as pd
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import LogisticRegression
from scipy.sparse import hstack, csr_matrix

DATA = "/workdir/random-acts-of-pizza/prepared/public/"
train = pd.DataFrame(json.load(open(DATA + "train.json")))
test = pd.DataFrame(json.load(open(DATA + "test.json")))
print("loaded data")
text = lambda d: (d["request_title"] + " " + d["request_text_edit_aware"]).fillna("")
num_cols = ["requester_account_age_in_days_at_request", "requester_number_of_comments_at_request",
            "requester_number_of_posts_at_request", "requester_upvotes_minus_downvotes_at_request"]
vec = TfidfVectorizer(max_features=5000, ngram_range=(1, 2), min_df=2)
x_train = hstack([vec.fit_transform(text(train)), csr_matrix(np.log1p(train[num_cols].clip(lower=0)).values)])
x_test = hstack([vec.transform(text(test)), csr_matrix(np.log1p(test[num_cols].clip(lower=0)).values)])
model = LogisticRegression(C=1.0, max_iter=2000)
model.fit(x_train, train["requester_received_pizza"].astype(int))
print("trained model")
prob = model.predict_proba(x_test)[:, 1]
pd.DataFrame({"request_id": test["request_id"], "requester_received_pizza": prob}).to_csv(
    "submission.csv", index=False)
print("predicted test labels")
"""

# A normal program: reads the data, writes a (constant) valid submission.
NORMAL = """
import csv
rows = list(csv.reader(open("/workdir/random-acts-of-pizza/prepared/public/sampleSubmission.csv")))
with open("submission.csv", "w") as f:
    csv.writer(f).writerows(rows)
print("normal run done", len(rows))
"""

FORK_BOMB = """
import os
while True:
    try:
        os.fork()
    except OSError:
        pass
"""

# 50 GB in 100 MB chunks, each touched so it is really resident.
ALLOCATE_50GB = """
chunks = []
for i in range(500):
    chunks.append(bytearray(b"x" * (100 << 20)))
    print("allocated", (i + 1) * 100, "MB", flush=True)
"""

INFINITE_LOOP = """
print("looping", flush=True)
while True:
    pass
"""

SLEEP_PAST_TIMEOUT = """
import time
print("sleeping", flush=True)
time.sleep(600)
"""

WRITE_1GB = """
block = b"x" * (1 << 20)
with open("big.bin", "wb") as f:
    for i in range(1024):
        f.write(block)
print("wrote 1 GB")
"""

# Many files, each under the per-file limit, together over the work dir's disk cap.
FILL_DISK = """
block = b"x" * (1 << 20)
for n in range(64):
    with open(f"part{n}.bin", "wb") as f:
        for i in range(48):
            f.write(block)
    print("file", n, flush=True)
"""

PRINT_100MB = """
import sys
line = "y" * 1023 + "\\n"
for i in range(100 * 1024):
    sys.stdout.write(line)
print("END-OF-OUTPUT")
"""

CONNECT_HOST_LOOPBACK = """
import socket
try:
    s = socket.create_connection(("127.0.0.1", PORT), timeout=3)
    s.sendall(b"escaped")
    print("CONNECTED")
except OSError as e:
    print("connect failed:", e)
"""

LIST_INTERFACES = """
import fcntl, json, socket, struct
names = [name for _, name in socket.if_nameindex()]
flags = {}
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for name in names:
    raw = fcntl.ioctl(s.fileno(), 0x8913, struct.pack("256s", name.encode()))  # SIOCGIFFLAGS
    flags[name] = struct.unpack("H", raw[16:18])[0]
print("IFACES " + json.dumps(flags))
"""

READ_SHADOW = """
try:
    print("SHADOW:" + open("/etc/shadow").read())
except OSError as e:
    print("denied:", e)
"""

# PATHS is replaced by the test with the host paths that must stay invisible.
READ_PRIVATE = """
import os
found = []
for p in PATHS:
    try:
        if os.path.isdir(p):
            found.append((p, os.listdir(p)))
        else:
            found.append((p, open(p).read(200)))
    except OSError as e:
        print("absent:", p, type(e).__name__)
# inherited descriptors pointing outside the sandbox would be a way out too
for fd in os.listdir("/proc/self/fd"):
    try:
        print("fd", fd, os.readlink(f"/proc/self/fd/{fd}"))
    except OSError:
        pass
for p, content in found:
    print("FOUND", p, str(content)[:100])
"""

WRITE_OUTSIDE = """
import os
targets = ["/etc/evil", "/usr/evil", "/evil", "/workdir/evil", "/opt/sandbox-venv/evil",
           "/workdir/random-acts-of-pizza/prepared/public/evil", "/workdir/random-acts-of-pizza/evil",
           "/proc/sys/kernel/hostname", "/tmp/TMPNAME"]
for t in targets:
    try:
        with open(t, "w") as f:
            f.write("x")
        print("WROTE", t)
    except OSError as e:
        print("blocked", t, type(e).__name__)
"""

# The daemon double-forks, says it is up, survives its parent, and a minute later would write a marker in
# the work dir. The parent exits once the daemon is up.
DAEMON = """
import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        with open("DAEMON_STARTED", "w") as f:
            f.write(str(os.getpid()))
        time.sleep(60)
        with open("DAEMON_MARKER", "w") as f:
            f.write(str(os.getpid()))
    os._exit(0)
while not os.path.exists("DAEMON_STARTED"):
    time.sleep(0.01)
print("parent exits, daemon left behind", flush=True)
"""

KILL_PARENT = """
import os, signal
print("ppid", os.getppid(), flush=True)
for target in (os.getppid(), 1):
    try:
        os.kill(target, signal.SIGKILL)
        print("sent SIGKILL to", target, flush=True)
    except OSError as e:
        print("kill", target, "failed:", e, flush=True)
try:
    os.kill(-1, signal.SIGKILL)
except OSError as e:
    print("kill -1 failed:", e, flush=True)
print("still alive", flush=True)
"""

CHDIR_SUBMISSION = """
import os
os.chdir("/tmp")
with open("submission.csv", "w") as f:
    f.write("request_id,requester_received_pizza\\n")
print("wrote", os.path.abspath("submission.csv"))
"""

SYMLINK_SUBMISSION = """
import os
os.symlink("/etc/passwd", "submission.csv")
print("linked")
"""

# a 7.9 MB submission whose header has a million extra fields, written in well under a second
WIDE_HEADER = """
n = 10**6
with open("submission.csv", "w") as f:
    f.write("request_id,requester_received_pizza," + ",".join(f"c{i}" for i in range(n)) + "\\nt3_x,0.5\\n")
print("wrote a wide header", flush=True)
"""

# many empty files first (they used to stop the disk watchdog's count), then 800 MB; format with files=N
MANY_FILES_THEN_BYTES = """
import os
os.makedirs("many", exist_ok=True)
for i in range({files}):
    open(f"many/{{i}}", "w").close()
print("made {files} empty files", flush=True)
block = b"x" * (1 << 20)
for n in range(16):
    with open(f"big{{n}}.bin", "wb") as f:
        for _ in range(50):
            f.write(block)
    print("wrote", (n + 1) * 50, "MB", flush=True)
"""

# A tree `depth` folders deep; format with depth=N. Past ~1,000 shutil.rmtree, which recurses, raised RecursionError
# in the executor (the tests use 1,200: every folder costs on this disk); past ~2,000 its paths exceed PATH_MAX.
DEEP_TREE = """
import os
for i in range({depth}):
    os.mkdir("d")
    os.chdir("d")
print("made a tree {depth} folders deep", flush=True)
"""

# The main process writes a submission and exits; a detached grandchild waits for it to be gone (polling, as a
# program would) and then rewrites submission.csv. What is graded must be what stood once every process was dead.
LATE_WRITER = """
import os, time
main = os.getpid()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        while True:
            try:
                os.kill(main, 0)
            except ProcessLookupError:
                break
            time.sleep(0.001)
        with open("submission.csv", "w") as f:
            f.write("request_id,requester_received_pizza\\n" + "t3_late,0.9\\n" * 20000)
    os._exit(0)
with open("submission.csv", "w") as f:
    f.write("request_id,requester_received_pizza\\nt3_main,0.5\\n")
print("main exits", flush=True)
"""
LATE_WRITER_MAIN_SUBMISSION = b"request_id,requester_received_pizza\nt3_main,0.5\n"

# 256 MB of holes: ~8 KB of disk in the sandbox, 256 MB once copied out (needs max_file_mb >= 256)
SPARSE_SUBMISSION = """
with open("submission.csv", "wb") as f:
    f.truncate(256 << 20)
print("a sparse submission of 256 MB", flush=True)
"""

# A child ptrace-attaches the sandbox's pid 1 (the program itself) and never resumes it: it stops for good.
PTRACE_STOP_INIT = """
import ctypes, os, time
libc = ctypes.CDLL(None, use_errno=True)
if os.fork() == 0:
    print("attach:", libc.ptrace(16, 1, None, None), ctypes.get_errno(), flush=True)  # PTRACE_ATTACH
    time.sleep(600)
    os._exit(0)
time.sleep(1)
print("main exits", flush=True)
"""
