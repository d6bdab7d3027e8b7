"""launch_ros actions for the processes of mstar_ros.launch_spec, used by ``launch/*.launch.py``.

Each :class:`~mstar_ros.launch_spec.ProcessSpec` becomes a ``launch_ros.actions.Node`` whose
exit ends the launch, as ``mstar-ros launch`` ends its process group:

- exit status 0 (``--duration`` reached, or stopped by a signal it handled): the launch shuts
  down cleanly and ``ros2 launch`` exits 0;
- any other status while the launch is running (bad weights path, bad placement, a crash):
  the handler raises :class:`NodeProcessFailed`, naming the process, its status and the last
  line it wrote to stderr (the node's one-line error). ``launch.LaunchService`` logs an
  exception raised by an event handler as ``Caught exception in launch ...: MESSAGE``, shuts
  everything down and returns 1 -- the only way a launch ends with a non-zero status (a
  ``Shutdown`` action's reason never changes it);
- while the launch is already shutting down (Ctrl-C), any status is part of that shutdown.

``launch`` and ``launch_ros`` are imported when the actions are built, not at import time:
they are not on PyPI, and this module is importable (and tested) without them.
"""

from __future__ import annotations

from collections.abc import Sequence

from mstar_ros.config_files import PACKAGE
from mstar_ros.launch_spec import ProcessSpec


class NodeProcessFailed(RuntimeError):
    """A node process exited with a non-zero status while the launch was running."""


class NodeExit:
    """The ``on_exit`` of one process's Node, and the ``on_stderr`` that keeps its last error line."""

    def __init__(self, spec: ProcessSpec) -> None:
        self.spec = spec
        self.last_error = ""

    def keep_line(self, text: str) -> None:
        """Output from the process's stderr (one line or several): remember its last non-empty line."""
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        if lines:
            self.last_error = lines[-1]

    def on_stderr(self, event) -> None:
        """launch.events.process.ProcessIO from the process's stderr (bytes)."""
        self.keep_line(event.text.decode(errors="replace"))

    def message(self, returncode: int) -> str:
        said = self.last_error or "it wrote nothing to stderr"
        return f"{self.spec.name} ({self.spec.executable}) exited with status {returncode}: {said}"

    def __call__(self, event, context):
        """launch.events.process.ProcessExited -> shut the launch down (non-zero: raise, see above)."""
        from launch.actions import Shutdown

        if context.is_shutdown:  # stopping already (Ctrl-C, or another process ended it)
            return None
        if event.returncode != 0:
            raise NodeProcessFailed(self.message(event.returncode))
        return [Shutdown(reason=f"{self.spec.name} exited with status 0")]


def node_actions(specs: Sequence[ProcessSpec]) -> list:
    """For each process: an OnProcessIO handler (its stderr's last line) and its Node (ending the launch
    when it exits). No ``name`` / ``namespace`` on the Node: a process hosts several nodes, and ``__node``
    / ``__ns`` remappings would rename all of them."""
    from launch.actions import RegisterEventHandler
    from launch.event_handlers import OnProcessIO
    from launch_ros.actions import Node

    actions: list = []
    for spec in specs:
        exit_ = NodeExit(spec)
        # the spec's parameters as a dict after the params files: launch_ros passes it after them, so it wins
        parameters = list(spec.params_files) + ([dict(spec.parameters)] if spec.parameters else [])
        node = Node(
            package=PACKAGE,
            executable=spec.executable,
            arguments=list(spec.arguments),
            parameters=parameters,
            remappings=list(spec.remappings),
            output="screen",
            on_exit=exit_,
        )
        actions += [RegisterEventHandler(OnProcessIO(target_action=node, on_stderr=exit_.on_stderr)), node]
    return actions
