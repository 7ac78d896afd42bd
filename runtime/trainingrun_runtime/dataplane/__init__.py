"""The rollout data plane: TransferQueue behind our clients, the checkpoint barrier, the replay index, snapshots.

`barrier` and `replay_index` are pure (asyncio / standard library); the clients, the storage units and the
checkpointer talk to TransferQueue 0.1.11 through Ray. Nothing here knows GRPO: rows are tensors by sample id.
"""
