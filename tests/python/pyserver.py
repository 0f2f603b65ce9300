"""One Python for a system test's many Python calls (lib.sh's `py`): torch, numpy and h5py are
imported once here, and each call runs in a child forked from this process, as `python ARGS...`
would run it (its arguments, standard input, environment, working directory; its own standard
output, error and exit status). A fresh `python -c 'import torch'` takes 1-2 s, and a test makes
tens of such calls. Nothing here runs a tensor operation before forking, so no thread pool is
copied into a child.

Protocol, one line per call on standard input: "DEADLINE_S DIR"; DIR holds argv (NUL-separated),
env (NUL-separated NAME=VALUE), cwd, stdin; the child writes DIR/stdout and DIR/stderr. The answer
is one line on standard output: the exit status (124 when the call ran past DEADLINE_S and was
killed). The server ends at end of input, or with the shell that started it (PR_SET_PDEATHSIG)."""
import ctypes
import os
import runpy
import signal
import sys
import time
import traceback

for module in ("numpy", "h5py", "torch"):
    try:
        __import__(module)
    except Exception:  # a stack without one of them: its calls import what they need themselves
        pass
try:
    ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG: end with the test's shell
except Exception:
    pass


def read_list(path):
    with open(path, "rb") as f:
        data = f.read()
    return [item.decode("utf-8", "surrogateescape") for item in data.split(b"\0")[:-1]]


def exit_status(code):
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def run_child(req):
    """In the forked child: become `python ARGV...` and never return."""
    status = 1
    try:
        argv = read_list(os.path.join(req, "argv"))
        env = dict(item.split("=", 1) for item in read_list(os.path.join(req, "env")) if "=" in item)
        with open(os.path.join(req, "cwd")) as f:
            cwd = f.read()
        for fd, name, mode in ((0, "stdin", os.O_RDONLY), (1, "stdout", os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                               (2, "stderr", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)):
            opened = os.open(os.path.join(req, name), mode, 0o644)
            os.dup2(opened, fd)
            os.close(opened)
        os.environ.clear()
        os.environ.update(env)
        os.chdir(cwd)
        if argv[0] == "-c":
            sys.argv = ["-c"] + argv[2:]
            sys.path[0] = ""
            exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__"})
        elif argv[0] == "-":
            sys.argv = argv
            sys.path[0] = ""
            exec(compile(sys.stdin.read(), "<stdin>", "exec"), {"__name__": "__main__"})
        else:
            sys.argv = argv
            sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
            runpy.run_path(argv[0], run_name="__main__")
        status = 0
    except SystemExit as e:
        status = exit_status(e.code)
    except BaseException:
        traceback.print_exc()
        status = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(status)


def wait_within(pid, deadline_s):
    end = time.monotonic() + deadline_s
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)
        if time.monotonic() > end:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return 124
        time.sleep(0.005)


def main():
    for line in sys.stdin:
        deadline_s, req = line.rstrip("\n").split(" ", 1)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            run_child(req)
        print(wait_within(pid, float(deadline_s)), flush=True)


if __name__ == "__main__":
    main()
