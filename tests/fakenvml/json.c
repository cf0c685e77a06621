#include "json.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *p, *end;
    int line, column;
    char *error;
    size_t error_size;
    int failed;
} parser;

static void fail(parser *ps, const char *fmt, ...) {
    if (ps->failed) return;
    ps->failed = 1;
    int n = snprintf(ps->error, ps->error_size, "%d:%d: ", ps->line, ps->column);
    if (n < 0 || (size_t)n >= ps->error_size) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ps->error + n, ps->error_size - (size_t)n, fmt, ap);
    va_end(ap);
}

static int peek(const parser *ps) { return ps->p < ps->end ? (unsigned char)*ps->p : -1; }

static void advance(parser *ps) {
    if (ps->p >= ps->end) return;
    if (*ps->p == '\n') {
        ps->line++;
        ps->column = 1;
    } else if (((unsigned char)*ps->p & 0xC0) != 0x80) {
        ps->column++; /* count characters, not UTF-8 continuation bytes */
    }
    ps->p++;
}

static void skip_space(parser *ps) {
    for (;;) {
        int c = peek(ps);
        if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
            advance(ps);
        } else {
            return;
        }
    }
}

static const char *describe(int c) {
    static char buf[16];
    if (c < 0) return "end of file";
    if (c >= 0x20 && c < 0x7F) {
        snprintf(buf, sizeof buf, "'%c'", c);
    } else {
        snprintf(buf, sizeof buf, "byte 0x%02X", c);
    }
    return buf;
}

static int literal(parser *ps, const char *word) {
    size_t n = strlen(word);
    if ((size_t)(ps->end - ps->p) < n || memcmp(ps->p, word, n) != 0) {
        fail(ps, "unexpected %s, expected a value", describe(peek(ps)));
        return 0;
    }
    for (size_t i = 0; i < n; i++) advance(ps);
    return 1;
}

static int hex4(parser *ps, unsigned *out) {
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        int c = peek(ps);
        v <<= 4;
        if (c >= '0' && c <= '9') {
            v |= (unsigned)(c - '0');
        } else if (c >= 'a' && c <= 'f') {
            v |= (unsigned)(c - 'a' + 10);
        } else if (c >= 'A' && c <= 'F') {
            v |= (unsigned)(c - 'A' + 10);
        } else {
            fail(ps, "invalid \\u escape: expected 4 hex digits");
            return 0;
        }
        advance(ps);
    }
    *out = v;
    return 1;
}

static size_t put_utf8(char *out, unsigned cp) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Reads a string starting at the opening quote; returns a malloc'd NUL-terminated copy. */
static char *parse_string(parser *ps) {
    advance(ps); /* opening quote */
    /* Escapes only ever shrink the text, so the raw span bounds the decoded size. */
    size_t cap = (size_t)(ps->end - ps->p) + 1;
    char *out = malloc(cap);
    size_t n = 0;
    if (!out) {
        fail(ps, "out of memory");
        return NULL;
    }
    for (;;) {
        int c = peek(ps);
        if (c < 0) {
            fail(ps, "unterminated string");
            break;
        }
        if (c == '"') {
            advance(ps);
            out[n] = '\0';
            return out;
        }
        if (c < 0x20) {
            fail(ps, "control character %s in string (escape it)", describe(c));
            break;
        }
        if (c != '\\') {
            out[n++] = (char)c;
            advance(ps);
            continue;
        }
        advance(ps);
        c = peek(ps);
        unsigned cp;
        switch (c) {
            case '"': case '\\': case '/': out[n++] = (char)c; advance(ps); continue;
            case 'b': out[n++] = '\b'; advance(ps); continue;
            case 'f': out[n++] = '\f'; advance(ps); continue;
            case 'n': out[n++] = '\n'; advance(ps); continue;
            case 'r': out[n++] = '\r'; advance(ps); continue;
            case 't': out[n++] = '\t'; advance(ps); continue;
            case 'u':
                advance(ps);
                if (!hex4(ps, &cp)) goto error;
                if (cp >= 0xD800 && cp <= 0xDBFF) {
                    unsigned low;
                    if (peek(ps) != '\\') {
                        fail(ps, "unpaired surrogate in \\u escape");
                        goto error;
                    }
                    advance(ps);
                    if (peek(ps) != 'u') {
                        fail(ps, "unpaired surrogate in \\u escape");
                        goto error;
                    }
                    advance(ps);
                    if (!hex4(ps, &low)) goto error;
                    if (low < 0xDC00 || low > 0xDFFF) {
                        fail(ps, "unpaired surrogate in \\u escape");
                        goto error;
                    }
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
                } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                    fail(ps, "unpaired surrogate in \\u escape");
                    goto error;
                }
                if (cp == 0) {
                    fail(ps, "\\u0000 is not allowed in strings here");
                    goto error;
                }
                n += put_utf8(out + n, cp);
                continue;
            default:
                fail(ps, "invalid escape \\%s", c < 0 ? "at end of file" : describe(c));
                goto error;
        }
    }
error:
    free(out);
    return NULL;
}

static void parse_number(parser *ps, json_value *v) {
    const char *start = ps->p;
    int integral = 1;
    if (peek(ps) == '-') advance(ps);
    if (peek(ps) == '0') {
        advance(ps);
    } else if (peek(ps) >= '1' && peek(ps) <= '9') {
        while (peek(ps) >= '0' && peek(ps) <= '9') advance(ps);
    } else {
        fail(ps, "invalid number: expected a digit, got %s", describe(peek(ps)));
        return;
    }
    if (peek(ps) == '.') {
        integral = 0;
        advance(ps);
        if (!(peek(ps) >= '0' && peek(ps) <= '9')) {
            fail(ps, "invalid number: expected a digit after '.'");
            return;
        }
        while (peek(ps) >= '0' && peek(ps) <= '9') advance(ps);
    }
    if (peek(ps) == 'e' || peek(ps) == 'E') {
        integral = 0;
        advance(ps);
        if (peek(ps) == '+' || peek(ps) == '-') advance(ps);
        if (!(peek(ps) >= '0' && peek(ps) <= '9')) {
            fail(ps, "invalid number: expected a digit in the exponent");
            return;
        }
        while (peek(ps) >= '0' && peek(ps) <= '9') advance(ps);
    }
    char buf[64];
    size_t len = (size_t)(ps->p - start);
    if (len >= sizeof buf) {
        fail(ps, "number too long");
        return;
    }
    memcpy(buf, start, len);
    buf[len] = '\0';
    v->type = JSON_NUMBER;
    v->number = strtod(buf, NULL);
    if (integral) {
        errno = 0;
        long long i = strtoll(buf, NULL, 10);
        if (errno == 0) {
            v->is_integer = 1;
            v->integer = i;
        }
    }
}

static void free_children(json_value *v);

static int parse_value(parser *ps, json_value *v, int depth);

static int push(parser *ps, json_value *parent, size_t *cap, json_value **slot) {
    if (parent->count == *cap) {
        size_t ncap = *cap ? *cap * 2 : 4;
        json_value *items = realloc(parent->items, ncap * sizeof *items);
        if (!items) {
            fail(ps, "out of memory");
            return 0;
        }
        parent->items = items;
        *cap = ncap;
    }
    *slot = &parent->items[parent->count];
    memset(*slot, 0, sizeof **slot);
    return 1;
}

/* Makes `v` an empty container of `type` and steps over its opening bracket. Returns 1, having
 * stepped over `close` as well, when nothing stands between the two. */
static int open_container(parser *ps, json_value *v, json_type type, int close) {
    v->type = type;
    advance(ps); /* [ or { */
    skip_space(ps);
    if (peek(ps) != close) return 0;
    advance(ps);
    return 1;
}

enum after { AFTER_FAILED, AFTER_NEXT, AFTER_CLOSED };

/* Reads what follows an item of an array or object: a ',' before the next item, or `close`. */
static enum after after_item(parser *ps, int close, const char *container) {
    skip_space(ps);
    int c = peek(ps);
    if (c == ',') {
        advance(ps);
        return AFTER_NEXT;
    }
    if (c == close) {
        advance(ps);
        return AFTER_CLOSED;
    }
    fail(ps, "unexpected %s in %s, expected ',' or '%c'", describe(c), container, close);
    return AFTER_FAILED;
}

static int parse_array(parser *ps, json_value *v, int depth) {
    size_t cap = 0;
    if (open_container(ps, v, JSON_ARRAY, ']')) return 1;
    for (;;) {
        json_value *item;
        skip_space(ps);
        if (!push(ps, v, &cap, &item)) return 0;
        v->count++;
        if (!parse_value(ps, item, depth + 1)) return 0;
        enum after next = after_item(ps, ']', "array");
        if (next != AFTER_NEXT) return next == AFTER_CLOSED;
    }
}

static int parse_object(parser *ps, json_value *v, int depth) {
    size_t cap = 0;
    if (open_container(ps, v, JSON_OBJECT, '}')) return 1;
    for (;;) {
        skip_space(ps);
        if (peek(ps) != '"') {
            fail(ps, "unexpected %s in object, expected a quoted key", describe(peek(ps)));
            return 0;
        }
        int key_line = ps->line, key_column = ps->column;
        char *key = parse_string(ps);
        if (!key) return 0;
        for (size_t i = 0; i < v->count; i++) {
            if (strcmp(v->items[i].key, key) == 0) {
                ps->line = key_line;
                ps->column = key_column;
                fail(ps, "duplicate key \"%s\"", key);
                free(key);
                return 0;
            }
        }
        json_value *member;
        if (!push(ps, v, &cap, &member)) {
            free(key);
            return 0;
        }
        member->key = key;
        member->key_line = key_line;
        member->key_column = key_column;
        v->count++;
        skip_space(ps);
        if (peek(ps) != ':') {
            fail(ps, "unexpected %s after key \"%s\", expected ':'", describe(peek(ps)), key);
            return 0;
        }
        advance(ps);
        skip_space(ps);
        if (!parse_value(ps, member, depth + 1)) return 0;
        enum after next = after_item(ps, '}', "object");
        if (next != AFTER_NEXT) return next == AFTER_CLOSED;
    }
}

static int parse_value(parser *ps, json_value *v, int depth) {
    if (depth > JSON_MAX_DEPTH) {
        fail(ps, "nested deeper than %d levels", JSON_MAX_DEPTH);
        return 0;
    }
    v->line = ps->line;
    v->column = ps->column;
    int c = peek(ps);
    switch (c) {
        case '{': return parse_object(ps, v, depth);
        case '[': return parse_array(ps, v, depth);
        case '"':
            v->type = JSON_STRING;
            v->string = parse_string(ps);
            return v->string != NULL;
        case 't': v->type = JSON_BOOL; v->boolean = 1; return literal(ps, "true");
        case 'f': v->type = JSON_BOOL; v->boolean = 0; return literal(ps, "false");
        case 'n': v->type = JSON_NULL; return literal(ps, "null");
        default:
            if (c == '-' || (c >= '0' && c <= '9')) {
                parse_number(ps, v);
                return !ps->failed;
            }
            fail(ps, "unexpected %s, expected a value", describe(c));
            return 0;
    }
}

json_value *json_parse(const char *text, size_t len, char *error, size_t error_size) {
    parser ps = {text, text + len, 1, 1, error, error_size, 0};
    if (error_size) error[0] = '\0';
    if (len > JSON_MAX_INPUT) {
        fail(&ps, "file larger than %u bytes", JSON_MAX_INPUT);
        return NULL;
    }
    if (memchr(text, '\0', len)) {
        fail(&ps, "file contains a NUL byte");
        return NULL;
    }
    json_value *root = calloc(1, sizeof *root);
    if (!root) {
        fail(&ps, "out of memory");
        return NULL;
    }
    /* A UTF-8 byte order mark is tolerated: editors on some systems write one. */
    if (len >= 3 && memcmp(text, "\xEF\xBB\xBF", 3) == 0) ps.p += 3;
    skip_space(&ps);
    if (parse_value(&ps, root, 0)) {
        skip_space(&ps);
        if (ps.p != ps.end) fail(&ps, "unexpected %s after the document", describe(peek(&ps)));
    }
    if (ps.failed) {
        json_free(root);
        return NULL;
    }
    return root;
}

static void free_children(json_value *v) {
    for (size_t i = 0; i < v->count; i++) {
        free_children(&v->items[i]);
        free(v->items[i].key);
    }
    free(v->items);
    free(v->string);
}

void json_free(json_value *value) {
    if (!value) return;
    free_children(value);
    free(value);
}

const json_value *json_get(const json_value *object, const char *key) {
    if (!object || object->type != JSON_OBJECT) return NULL;
    for (size_t i = 0; i < object->count; i++) {
        if (strcmp(object->items[i].key, key) == 0) return &object->items[i];
    }
    return NULL;
}

const char *json_type_name(json_type type) {
    switch (type) {
        case JSON_NULL: return "null";
        case JSON_BOOL: return "a boolean";
        case JSON_NUMBER: return "a number";
        case JSON_STRING: return "a string";
        case JSON_ARRAY: return "an array";
        case JSON_OBJECT: return "an object";
    }
    return "a value";
}
