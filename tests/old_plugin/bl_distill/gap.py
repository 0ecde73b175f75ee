"""A callback a run can name: ``beatloop run distill --callback distill_gap``
(docs/plugins.md and docs/callbacks.md at beatloop 0.1.0)."""

import sys

import beatloop


class DistillGap(beatloop.Callback):
    """Each epoch: how far the student trails the teacher, and how often they agree."""

    callback_name = "distill_gap"

    def __init__(self, stream=None):
        self.stream = stream or sys.stdout
        self.gaps: list[float] = []
        self.agreements: list[float] = []

    def on_epoch_end(self, run, epoch, logs):
        teacher, student = logs["val_teacher_accuracy"], logs["val_student_accuracy"]
        gap, agreement = float(teacher - student), float(logs["val_agreement"])
        self.gaps.append(gap)
        self.agreements.append(agreement)
        logs["distill_gap"] = gap  # logged with the epoch (history.jsonl, csv, ...)
        print(
            f"distill_gap epoch {epoch + 1}: teacher {teacher:.4f} student {student:.4f} "
            f"gap {gap:+.4f} agreement {agreement:.4f}",
            file=self.stream,
        )

    def checkpoint_state(self):
        return {"gaps": self.gaps, "agreements": self.agreements}

    def restore_state(self, state):
        self.gaps, self.agreements = list(state["gaps"]), list(state["agreements"])
