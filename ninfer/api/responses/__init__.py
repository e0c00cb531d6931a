"""OpenAI Responses: request schema, service, Items, the Response object, its event stream, the
local store and the routes."""
