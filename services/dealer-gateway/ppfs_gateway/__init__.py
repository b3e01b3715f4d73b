"""The dealer-gateway: REST job API that relays sealed uploads to the parties and never sees data."""
