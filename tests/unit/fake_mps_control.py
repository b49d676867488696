"""A stand-in for nvidia-cuda-mps-control on machines without the NVIDIA driver
(tests/unit/test_mps.py writes it out with a shebang). `-f`: the daemon, in the foreground,
on a Unix socket `control` in CUDA_MPS_PIPE_DIRECTORY, answering each command; `quit` ends
it. Without arguments: a client that sends stdin's command to the daemon and prints the
answer (exit 1 when no daemon answers, as the real one). FAKE_MPS_FAIL=1: the daemon fails
to start; FAKE_MPS_RECORD: a file each received command is appended to."""

import os
import socket
import sys

path = os.path.join(os.environ["CUDA_MPS_PIPE_DIRECTORY"], "control")
if sys.argv[1:] == ["-f"]:
    if os.environ.get("FAKE_MPS_FAIL"):
        print("cannot start", file=sys.stderr)
        sys.exit(3)
    server = socket.socket(socket.AF_UNIX)
    server.bind(path)
    server.listen()
    while True:
        conn, _ = server.accept()
        command = conn.recv(256).decode().strip()
        record = os.environ.get("FAKE_MPS_RECORD")
        if record:
            with open(record, "a") as f:
                f.write(command + "\n")
        conn.sendall(b"\n")
        conn.close()
        if command == "quit":
            os.unlink(path)
            sys.exit(0)
client = socket.socket(socket.AF_UNIX)
try:
    client.connect(path)
except OSError:
    print("Cannot find MPS control daemon process", file=sys.stderr)
    sys.exit(1)
client.sendall(sys.stdin.read().encode())
print(client.recv(256).decode(), end="")
