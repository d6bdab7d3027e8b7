"""A Worker process's ROS 2 node: ``/mstar/worker_<rank>`` reports its engines on /diagnostics.

Loaded into each Worker process as a plugin (``WorkerPool(plugins=[PLUGIN])``; the name is
registered in setup.py under the entry-point group ``mstar.worker_plugins``), so
``ros2 topic echo /diagnostics`` shows every process of the node set, not only the
Conductor's. It runs its own rclpy context and thread: the Worker's device thread
never waits for ROS.
"""

from __future__ import annotations

import threading

PLUGIN = "ros_diagnostics"  # -> attach(), by its entry point


class WorkerDiagnostics:
    def __init__(self, host) -> None:
        import rclpy
        from diagnostic_msgs.msg import DiagnosticArray
        from rclpy.executors import SingleThreadedExecutor

        from mstar_ros.bag.ros_env import apply_localhost_defaults
        from mstar_ros.ros.common.diagnostics import publish_status

        apply_localhost_defaults()
        self.context = rclpy.Context()
        from rclpy.signals import SignalHandlerOptions

        # no rclpy signal handlers: the Worker's shutdown is its Conductor's call, not Ctrl-C's
        rclpy.init(args=[], context=self.context, signal_handler_options=SignalHandlerOptions.NO)
        self.node = rclpy.create_node(f"worker_{host.rank}", namespace="/mstar", context=self.context)
        pub = self.node.create_publisher(DiagnosticArray, "/diagnostics", 10)

        def publish() -> None:
            worker = host.worker
            values = {
                "nodes": ",".join(worker.nodes),
                "kv_blocks_used": worker.kv_blocks_used(),
                "tensors_held": len(host.exchange),
            }
            for engine, counters in worker.stats().items():
                values.update({f"{engine}.{k}": v for k, v in counters.items()})
            publish_status(self.node, pub, f"mstar: worker {host.rank}", "serving", f"rank{host.rank}", values)

        self.node.create_timer(1.0, publish)
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)
        self.thread = threading.Thread(target=self.executor.spin, name="rclpy-worker", daemon=True)
        self.thread.start()

    def close(self) -> None:
        from mstar_ros.bag.shm_ports import shut_down_removing_ports

        shut_down_removing_ports(self._shut_down)  # and the Fast DDS ports nobody uses now

    def _shut_down(self) -> None:
        self.executor.shutdown()
        self.node.destroy_node()
        self.context.try_shutdown()


def attach(host) -> WorkerDiagnostics:
    return WorkerDiagnostics(host)
