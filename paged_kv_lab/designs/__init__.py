"""Two other KV-cache designs, modelled beside kvcore (vLLM) to compare on the same requests.

``designs/sglang/srt/mem_cache/`` mirrors SGLang 0.5.23's radix tree and
``designs/nanovllm/engine/`` nano-vllm's block manager, each at its project's own path and under
its own names. Like kvcore, nothing here imports Streamlit, plotly or torch.
"""
