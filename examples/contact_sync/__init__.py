"""Contact sync: each contact's latest state sent once, however often it changed."""
