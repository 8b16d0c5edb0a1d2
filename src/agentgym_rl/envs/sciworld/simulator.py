"""`Simulator`: one ScienceWorld JVM and the py4j handle to its simulator.

We start the JVM ourselves (with the package's own jar and py4j's `launch_gateway`) instead
of through `scienceworld.ScienceWorldEnv`, for three reasons:

- JVM options. `ScienceWorldEnv` starts Java with its defaults: on our 24 GiB machine a JVM
  grew to 2.9 GB resident after ten gold-path episodes (the default heap limit is a quarter
  of RAM and G1 rarely gives memory back). `-Xmx512m -XX:+UseSerialGC` held it at ~460 MB
  and ran those episodes faster (13 s instead of 20 s); the serial collector also keeps GC
  to one thread on a 2-core machine running many JVMs.
- Determinism. The simulator lists a room's objects in identity-hash order, so a second
  `load` of the same variation in the same JVM shows them in another order (a fresh JVM is
  always the same). `-XX:hashCode=2` (every identity hash is 1) makes iteration follow
  insertion order: loads, replays and fresh JVMs then give identical observations, and
  loading with or without the gold path gives the same world. It was not slower here.
- Cost per step. `ScienceWorldEnv.step` also fetches the room, the inventory, the task and
  every valid action-object combination on every step; the env needs none of them.

The JVM is a child process that dies with us (`--die-on-broken-pipe`: it exits when its
stdin closes, which also happens when this process dies).

Nothing here talks to the JVM from the garbage collector. By default py4j releases each Java
object from a finalizer, over the network; a simulator collected after its JVM has gone then
logs a refused connection from inside the collector, and formatting that traceback (Python
3.11 parses source lines to underline them) broke an unrelated `compile` the collection had
interrupted, failing a test elsewhere. So py4j's memory management is off (the few objects we
keep are released by `release`), and `close` only closes sockets and the JVM's stdin.
"""

from __future__ import annotations

import subprocess
from typing import Any

from py4j.java_gateway import GatewayParameters, JavaGateway, launch_gateway
from py4j.protocol import Py4JError, Py4JJavaError
from scienceworld.constants import BASEPATH, JAR_PATH

#: See the module docstring.
JAVA_OPTIONS = ("-Xmx512m", "-XX:+UseSerialGC", "-XX:+UnlockExperimentalVMOptions", "-XX:hashCode=2")
#: Seconds to wait for the JVM to exit after its stdin closes, before killing it.
EXIT_TIMEOUT = 5.0



def check_java(**kwargs: object) -> None:
    """A `UserError` when no `java` is on PATH: ScienceWorld's simulator runs in a JVM
    (`EnvSpec.installed_entry_point`, checked before any work)."""
    import shutil

    from ...errors import UserError

    if shutil.which("java") is None:
        raise UserError("sciworld needs Java 17+ on PATH: install it (Debian: `apt-get install "
                        "default-jre-headless`; `make test` does)")

class SimulatorDied(RuntimeError):
    """The JVM died or its connection broke (a py4j network error)."""


def is_connection_error(error: BaseException) -> bool:
    """Whether `error` means the JVM is gone (rather than a Java exception in the simulator)."""
    return isinstance(error, Py4JError) and not isinstance(error, Py4JJavaError)


class Simulator:
    """A running ScienceWorld JVM.

    Calls go through `server` (the simulator's `PythonInterface`); a dead JVM makes them
    raise a py4j error (see `is_connection_error`). `close` is idempotent.
    """

    def __init__(self, java_options: tuple[str, ...] = JAVA_OPTIONS) -> None:
        self._proc: subprocess.Popen | None = None
        self._gateway: JavaGateway | None = None
        try:
            port, self._proc = launch_gateway(classpath=JAR_PATH, cwd=BASEPATH, javaopts=list(java_options),
                                              die_on_exit=True, return_proc=True)
        except FileNotFoundError as error:
            raise RuntimeError(f"ScienceWorld needs Java 17+ (`java` on PATH): {error}") from error
        try:
            # No callback server: the simulator never calls back into Python, and each one
            # would cost a listening socket and a thread.
            self._gateway = JavaGateway(gateway_parameters=GatewayParameters(
                port=port, enable_memory_management=False), java_process=self._proc)
            self.server: Any = self._gateway.jvm.scienceworld.runtime.pythonapi.PythonInterface()
        except BaseException:
            self.close()
            raise

    @property
    def pid(self) -> int | None:
        """The JVM's process id (None once closed)."""
        return self._proc.pid if self._proc is not None else None

    def release(self, java_object: Any) -> None:
        """Let the JVM drop `java_object` (a returned array or object, once read): with
        memory management off, py4j keeps every returned object alive on the Java side."""
        if self._gateway is not None:
            self._gateway.detach(java_object)

    def close(self) -> None:
        """Stop the JVM and release the connection; safe to call more than once, and from
        the garbage collector (no round trip to the JVM, which may already be gone)."""
        gateway, proc = self._gateway, self._proc
        self._gateway, self._proc = None, None
        if gateway is not None:
            gateway.close(keep_callback_server=True)  # our sockets only; there is no callback server
        if proc is None:
            return
        try:
            if proc.stdin is not None:
                proc.stdin.close()  # the JVM exits on the broken pipe
        except OSError:
            pass
        try:
            proc.wait(timeout=EXIT_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def __del__(self) -> None:  # a forgotten simulator must not leave a JVM behind
        try:
            self.close()
        except Exception:  # noqa: BLE001 — interpreter shutdown may have torn modules down
            pass
