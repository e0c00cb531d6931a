"""Anthropic Messages: the request parser (`request`) and the routes, count_tokens included (`routes`)."""
