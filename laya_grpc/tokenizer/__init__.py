"""The tokenizer service: renders states and questions as upstream laya does and encodes them
into packed token rows."""
