"""OpenAI Chat Completions: the request parser (`request`) and the route (`routes`)."""
