"""Marketing sync: contact activities pushed to a bulk API, 1,000 records per call."""
