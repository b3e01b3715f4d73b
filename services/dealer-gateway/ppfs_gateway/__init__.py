"""The dealer-gateway: the REST job API; relays sealed uploads and never sees data."""
