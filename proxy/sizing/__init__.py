"""Sizing: lengths into `max_model_len`, KV-cache capacity and GPUs — pure maths, no request path.

Owns one definition of each length concept (`lengths`), exact histograms (`histogram`), the asks
(`demand`), what requests needed and the recommendation (`need`, `report`), two pools by length
(`pools`), the model's own context bound (`model_context`), KV-cache
capacity per attention layout (`capacity`), weights and GPUs (`weights`, `gpus`), vLLM's per-step
limits (`scheduler_limits`), one deployment judged (`deploy`), and the running vLLM's own figures
(`vllm_metrics`, `live`). Depends only on `proxy.errors`, so the offline commands import nothing
of the request path or the tokenizer stack.
"""
