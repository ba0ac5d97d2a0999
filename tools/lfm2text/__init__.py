"""The text front end of lfm2-rank (tools/lfm2_text.py): the model file's tokenizer and chat
template as transformers uses them (model_text, chat_template), JSONL requests (requests), inputs
and outputs files (token_files), and incremental detokenization with stop strings (detok)."""
