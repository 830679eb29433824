"""What of the user's input Pipecat really took.

The user aggregator (``LLMUserAggregator``) is where Pipecat decides whether user input counts: its
mute strategies (``FunctionCallUserMuteStrategy``, ``FirstSpeechUserMuteStrategy``, ...) drop speech
frames and transcripts while muted, so "Hello? Are you there?" said during a tool call never reaches
its context. calltape therefore records user input where that aggregator *processes* it (observers
see each processing in order, after whatever the aggregator pushed before it), and takes the mute
state from the ``UserMuteStartedFrame`` / ``UserMuteStoppedFrame`` the aggregator broadcasts. Muted
transcripts go to the log as ``x.pipecat.muted`` (kept for audit, outside every context).

A pipeline without a user aggregator (a speech-to-speech service, say) is recorded where the input
is first pushed, as before.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pipecat.frames.frames import (
    Frame,
    InterimTranscriptionFrame,
    TranscriptionFrame,
    UserStartedSpeakingFrame,
    UserStoppedSpeakingFrame,
    VADUserStartedSpeakingFrame,
    VADUserStoppedSpeakingFrame,
)

MUTED_EVENT = "x.pipecat.muted"

USER_INPUT = (
    VADUserStartedSpeakingFrame,
    VADUserStoppedSpeakingFrame,
    UserStartedSpeakingFrame,
    UserStoppedSpeakingFrame,
    InterimTranscriptionFrame,
    TranscriptionFrame,
)
"""The frames that carry the user's input (and that a muted user aggregator drops)."""

try:  # Pipecat >= 1.10 has user mute strategies on the aggregator
    from pipecat.frames.frames import UserMuteStartedFrame, UserMuteStoppedFrame

    MUTE_FRAMES: tuple[type[Frame], ...] = (UserMuteStartedFrame, UserMuteStoppedFrame)
except ImportError:  # pragma: no cover - older Pipecat
    MUTE_FRAMES = ()


class UserInput:
    """Maps user input frames to ``user.*`` events, once each, honouring the aggregator's mute."""

    def __init__(self, emit: Callable[[str, dict[str, Any]], None]) -> None:
        self._emit = emit
        self.vad_seen = False
        self.speaking = False
        self.spoke = False
        """User activity since the latest agent reply began (what makes an interruption the user's)."""
        self.muted: dict[int, bool] = {}

    def mute_changed(self, aggregator: Any, frame: Frame) -> None:
        """A mute frame broadcast by ``aggregator``."""
        if MUTE_FRAMES:
            self.muted[id(aggregator)] = isinstance(frame, MUTE_FRAMES[0])

    def is_muted(self, aggregator: Any) -> bool:
        """Whether ``aggregator`` drops user input right now."""
        return self.muted.get(id(aggregator), False)

    def dropped(self, frame: Frame) -> None:
        """A frame the muted aggregator discards: only a final transcript is worth keeping (x. event)."""
        if isinstance(frame, TranscriptionFrame) and frame.text.strip():
            self._emit(MUTED_EVENT, {"text": frame.text})

    def take(self, frame: Frame) -> None:
        """One user input frame Pipecat took."""
        if isinstance(frame, VADUserStartedSpeakingFrame):
            self.vad_seen = True
            self._started("vad")
        elif isinstance(frame, VADUserStoppedSpeakingFrame):
            self.vad_seen = True
            self._stopped()
        elif isinstance(frame, UserStartedSpeakingFrame):
            if not self.vad_seen:
                self._started(None)
        elif isinstance(frame, UserStoppedSpeakingFrame):
            if not self.vad_seen:
                self._stopped()
        elif isinstance(frame, InterimTranscriptionFrame):
            if frame.text.strip():
                self.spoke = True
                self._emit("user.transcript", {"text": frame.text, "final": False})
        elif isinstance(frame, TranscriptionFrame):
            if frame.text.strip():
                self.spoke = True
                self._emit("user.transcript", {"text": frame.text, "final": True})

    def _started(self, source: str | None) -> None:
        self.spoke = True
        if self.speaking:
            return
        self.speaking = True
        self._emit("user.speech.started", {"source": source} if source else {})

    def _stopped(self) -> None:
        if not self.speaking:
            return
        self.speaking = False
        self._emit("user.speech.stopped", {})
