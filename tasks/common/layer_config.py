"""The options the efficiency tasks (throughput, memory) share: one layer's shape, dtype,
the options of the mixer under test and of the softmax baseline, and the T grid."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from tasks.base import TaskConfig
from tasks.common.workloads import DTYPES, LayerSpec


def length_grid(v: list[int]) -> list[int]:
    """A task's seq_lens: non-empty, every length >= 1; returned sorted, without repeats."""
    if not v or min(v) < 1:
        raise ValueError(f"seq_lens must be a non-empty list of lengths >= 1, got {v}")
    return sorted(set(v))


class LayerTaskConfig(TaskConfig):
    seq_lens: list[int] = Field(default_factory=lambda: [64, 128, 256, 512, 1024], description="T grid")
    num_heads: int = Field(2, ge=1)
    head_dim: int = Field(32, ge=1, description="K = V per head")
    d_model: int | None = Field(None, ge=1, description="layer width; default num_heads * head_dim")
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    mixer: dict[str, Any] = Field(default_factory=dict, description="options of the mixer under test (backend, chunk_size, ...)")
    softmax: dict[str, Any] = Field(default_factory=dict, description="options of the softmax baseline (e.g. backend)")
    # One thread by default: on a shared CPU, ops split over threads wait on each other and
    # their times scatter by 5x or more. null: torch's default.
    cpu_threads: int | None = Field(1, ge=1, description="torch intra-op threads on the CPU during the run")

    @field_validator("seq_lens")
    @classmethod
    def _grid(cls, v: list[int]) -> list[int]:
        return length_grid(v)

    @field_validator("mixer", "softmax")
    @classmethod
    def _sizes_are_task_fields(cls, v: dict[str, Any]) -> dict[str, Any]:
        clash = sorted({"num_heads", "head_dim"} & set(v))
        if clash:
            raise ValueError(f"{clash} are task fields here (the layer's sizes): set them at the top level, "
                             f"e.g. --set num_heads=4, not inside mixer/softmax")
        return v

    @property
    def width(self) -> int:
        """d_model of the layer: d_model, or num_heads * head_dim when unset."""
        return self.d_model or self.num_heads * self.head_dim

    def layer_spec(self, options: dict[str, Any]) -> LayerSpec:
        """The layer with these mixer options (self.mixer or self.softmax)."""
        return LayerSpec(self.num_heads, self.head_dim, self.width, DTYPES[self.dtype], options)
