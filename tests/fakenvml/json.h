/* A small strict JSON parser (RFC 8259) for the fake NVML configuration.
 *
 * Parses a whole document into a tree; every value remembers its 1-based line and column so that
 * configuration errors can say where they are. Input is limited in size and nesting depth, which
 * keeps a malformed or hostile file from exhausting the stack or memory of the process under test.
 */
#ifndef FAKENVML_JSON_H
#define FAKENVML_JSON_H

#include <stddef.h>

#define JSON_MAX_DEPTH 32
#define JSON_MAX_INPUT (1u << 20)

typedef enum { JSON_NULL, JSON_BOOL, JSON_NUMBER, JSON_STRING, JSON_ARRAY, JSON_OBJECT } json_type;

typedef struct json_value {
    json_type type;
    int line, column;
    /* JSON_BOOL */
    int boolean;
    /* JSON_NUMBER: is_integer when written without fraction or exponent and within long long. */
    int is_integer;
    long long integer;
    double number;
    /* JSON_STRING: UTF-8, NUL-terminated, never contains NUL. */
    char *string;
    /* JSON_ARRAY and JSON_OBJECT: children in document order; object members carry their key. */
    struct json_value *items;
    size_t count;
    char *key;
    int key_line, key_column; /* where the key of an object member starts */
} json_value;

/* Parses `text` (length `len`). Returns a tree to release with json_free, or NULL with a message
 * "line:column: what" in `error` (at least 160 bytes). */
json_value *json_parse(const char *text, size_t len, char *error, size_t error_size);

void json_free(json_value *value);

/* The member `key` of an object, or NULL. */
const json_value *json_get(const json_value *object, const char *key);

const char *json_type_name(json_type type);

#endif
