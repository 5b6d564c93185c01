"""The microgpt app: Karpathy's microgpt (a GPT in scalar Values) ported to micrograd_c (model),
its documents and tokenizer (data), and its training and sampling through a compiled module
(train; `python -m gpt`, `make gpt`)."""
