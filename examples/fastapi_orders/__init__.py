"""FastAPI orders: async endpoints write orders and their events; an async handler ships them."""
