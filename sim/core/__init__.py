"""Below the schedulers: requests, batches, the KV cache manager, the TTFT accounting."""
