"""The OpenAI wire format, in one place (private): what capture, the proxy, the mock server and the backends share.

- :mod:`.messages`: chat messages (text of a message, Responses input as chat messages, plain data);
- :mod:`.read`: a request as sent and the response or stream as received, read into ``Call`` fields;
- :mod:`.payloads`: chat / completion / Responses bodies and their stream chunks and events, to send.
"""
