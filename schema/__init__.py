"""Chakra execution-trace schema (``et_def.proto``, package ``ChakraProtoMsg``) and its bindings."""
