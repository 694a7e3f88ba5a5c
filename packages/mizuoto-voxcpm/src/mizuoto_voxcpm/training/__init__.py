"""Fine-tuning VoxCPM (full and LoRA) as upstream's ``scripts/train_voxcpm_finetune.py`` does,
step for step: see ``docs/engines/voxcpm.md`` (Training)."""

from mizuoto_voxcpm.training.trainer import VoxCPMTrainer

__all__ = ["VoxCPMTrainer"]
