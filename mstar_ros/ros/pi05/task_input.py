"""The policy node's task: the ``prompt`` topic and parameter (a part of PolicyNode).

A new prompt is capped in bytes and tokens and tokenized once, when it changes; a refused one
keeps the task that was. Only the prompt changes while serving: other parameters are refused.
"""

from __future__ import annotations

from rcl_interfaces.msg import SetParametersResult
from std_msgs.msg import String

from mstar_graphs.pi05.prompt import PromptError


class TaskInput:
    """PolicyNode's prompt callbacks."""

    def _subscribe_task(self) -> None:
        self.create_subscription(String, "prompt", self._on_prompt, 10)
        self.add_on_set_parameters_callback(self._on_set_parameters)

    def _on_prompt(self, msg) -> None:
        self._set_prompt(msg.data, self._full("prompt"))

    def _set_prompt(self, text: str, source: str) -> str | None:
        """Takes a new task (tokenized here, once, off every lock); the reason it was refused, or None."""
        cap = self.params.max_prompt_bytes
        if len(text) > cap or len(text.encode("utf-8", "replace")) > cap:  # chars first: no 1 MB encode
            why = f"prompt refused: over max_prompt_bytes={cap}"
        else:
            try:
                task = self.policy.task(text, max_tokens=self.token_cap)
            except PromptError as exc:
                why = "empty prompt ignored" if not text.strip() else f"prompt refused: {exc}"
            else:
                with self._lock:
                    self.task, self.prompt, self._truncation_said = task, task.text, False
                return None
        self._problem(
            ("prompt", source), f"{source}: {why} (keeping {self.prompt!r})", "ERROR", count="prompts_refused"
        )
        return why

    def _on_set_parameters(self, params) -> SetParametersResult:
        """Only the prompt changes while serving; the others are read at start (refused, not ignored)."""
        fixed = [p.name for p in params if p.name != "prompt"]
        if fixed:
            return SetParametersResult(
                successful=False, reason=f"{', '.join(fixed)}: read at start; restart the node set to change it"
            )
        for param in params:
            why = self._set_prompt(str(param.value), f"{self.get_fully_qualified_name()} parameter prompt")
            if why is not None:
                return SetParametersResult(successful=False, reason=why)
        return SetParametersResult(successful=True)
