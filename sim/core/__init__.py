"""What the scheduler and the accounting share: requests, batches, KV blocks, TTFT clocks."""
