"""Programs that run as a TrainingRun's driver through the SDK (`spec.driver`, docs/sdk.md): each one a user's
trainer in small, shipped in the runtime image so that an example's entrypoint is `python -m` on any pod."""
