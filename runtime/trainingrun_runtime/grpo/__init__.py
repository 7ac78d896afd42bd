"""The math of the trainer: the GRPO objective, the policy network, the task, seeds, group sampling, the trainer.

Plain torch and the standard library: no Ray, no TransferQueue. Each module is testable in one process.
"""
