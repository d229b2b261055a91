"""The engine: what serves requests on the model (:mod:`slimrag.llm.model`), in nano-vllm's shape.

Parts, one module each: ``request`` (:class:`~slimrag.llm.engine.request.Request`, one request
carried through prefill, decode and store), ``lifecycle`` (what happens to a request: admitted,
prefilled on its cached prefix, decoded, stored), ``scheduler`` (the prefill gate: one prefill at
a time, longest cached prefix first), ``runner`` (the model behind one generator: loading, every
forward under the model lock, the prefill schedule, what the KV lease calls back through),
``batcher`` (concurrent streams share decode steps), ``decoding`` (token choice, streaming text,
the loop guard), ``keys`` (where a prompt's segments are filed in the knowledge tree).
:class:`slimrag.llm.local.LocalGenerator` builds them and hands each its state.

Nothing is imported here: ``decoding`` is read without torch by a one-shot ``ask``'s evidence
lead, so importing this package must not load the model's modules.
"""
