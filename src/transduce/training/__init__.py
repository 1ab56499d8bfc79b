"""The training recipe of section 5: loss, schedule, batching, checkpoints, the loop."""
