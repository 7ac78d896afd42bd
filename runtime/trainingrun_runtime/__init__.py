"""trainingrun driver side: data-plane checkpoint, replay index, checkpoint bundle and the GRPO single controller."""
