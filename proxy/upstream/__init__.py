"""The upstream side: vLLM servers, their models and their failures.

Owns the lean HTTP/1.1 pool (`http1`) and the client over it (`client.Upstream`), the choice of
upstream by model (`backends`), each upstream's model list and `max_model_len` (`models`), the cap
on concurrent requests (`gate`), and upstream errors as data (`failure`) and as the explanation a
client sees (`explain`). Imports only the root modules (`errors`, `asgi`, `config`).
"""
