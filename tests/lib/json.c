// A small strict JSON reader (tests/lib/json.h).
#include "json.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

typedef struct reader {
    const char *p, *end;
    const char *err;
    int         depth;
} reader;

static void skip_ws(reader *r) {
    while (r->p < r->end && (*r->p == ' ' || *r->p == '\n' || *r->p == '\r' || *r->p == '\t'))
        r->p++;
}

static bool parse_value(reader *r, json *v);

static bool parse_string(reader *r, char **out) {
    if (r->p >= r->end || *r->p != '"')
        return r->err = "expected a string", false;
    r->p++;
    size_t cap = 16, n = 0;
    char  *s = malloc(cap);
    while (r->p < r->end && *r->p != '"') {
        unsigned char c = (unsigned char)*r->p++;
        if (c < 0x20) {
            free(s);
            return r->err = "control byte in a string", false;
        }
        if (c == '\\') {
            if (r->p >= r->end)
                break;
            char e = *r->p++;
            switch (e) {
            case '"':
                c = '"';
                break;
            case '\\':
                c = '\\';
                break;
            case '/':
                c = '/';
                break;
            case 'b':
                c = '\b';
                break;
            case 'f':
                c = '\f';
                break;
            case 'n':
                c = '\n';
                break;
            case 'r':
                c = '\r';
                break;
            case 't':
                c = '\t';
                break;
            case 'u': {
                unsigned u = 0;
                for (int i = 0; i < 4; i++) {
                    if (r->p >= r->end || !isxdigit((unsigned char)*r->p)) {
                        free(s);
                        return r->err = "bad \\u escape", false;
                    }
                    char h = *r->p++;
                    u      = u * 16 +
                        (unsigned)(isdigit((unsigned char)h) ? h - '0' : (tolower(h) - 'a' + 10));
                }
                c = u < 0x80 ? (unsigned char)u : '?';
                break;
            }
            default:
                free(s);
                return r->err = "bad escape", false;
            }
        }
        if (n + 2 > cap)
            s = realloc(s, cap *= 2);
        s[n++] = (char)c;
    }
    if (r->p >= r->end) {
        free(s);
        return r->err = "unterminated string", false;
    }
    r->p++;
    s[n] = 0;
    *out = s;
    return true;
}

static bool parse_number(reader *r, json *v) {
    const char *s = r->p;
    if (r->p < r->end && *r->p == '-')
        r->p++;
    if (r->p >= r->end || !isdigit((unsigned char)*r->p))
        return r->err = "bad number", false;
    if (*r->p == '0')
        r->p++;
    else
        while (r->p < r->end && isdigit((unsigned char)*r->p))
            r->p++;
    if (r->p < r->end && *r->p == '.') {
        r->p++;
        if (r->p >= r->end || !isdigit((unsigned char)*r->p))
            return r->err = "bad fraction", false;
        while (r->p < r->end && isdigit((unsigned char)*r->p))
            r->p++;
    }
    if (r->p < r->end && (*r->p == 'e' || *r->p == 'E')) {
        r->p++;
        if (r->p < r->end && (*r->p == '+' || *r->p == '-'))
            r->p++;
        if (r->p >= r->end || !isdigit((unsigned char)*r->p))
            return r->err = "bad exponent", false;
        while (r->p < r->end && isdigit((unsigned char)*r->p))
            r->p++;
    }
    char   buf[64];
    size_t k = (size_t)(r->p - s);
    if (k >= sizeof buf)
        return r->err = "number too long", false;
    memcpy(buf, s, k);
    buf[k]  = 0;
    v->type = JSON_NUM;
    v->num  = strtod(buf, NULL);
    return true;
}

static bool literal(reader *r, const char *word) {
    size_t k = strlen(word);
    if ((size_t)(r->end - r->p) < k || memcmp(r->p, word, k) != 0)
        return r->err = "bad literal", false;
    r->p += k;
    return true;
}

static bool parse_items(reader *r, json *v, bool obj) {
    char close = obj ? '}' : ']';
    r->p++;
    int cap = 0;
    v->type = obj ? JSON_OBJ : JSON_ARR;
    skip_ws(r);
    if (r->p < r->end && *r->p == close) {
        r->p++;
        return true;
    }
    for (;;) {
        if (v->n == cap) {
            cap      = cap ? cap * 2 : 8;
            v->items = realloc(v->items, sizeof(json) * (size_t)cap);
            if (obj)
                v->keys = realloc(v->keys, sizeof(char *) * (size_t)cap);
        }
        json *it = &v->items[v->n];
        memset(it, 0, sizeof *it);
        skip_ws(r);
        if (obj) {
            if (!parse_string(r, &v->keys[v->n]))
                return false;
            skip_ws(r);
            if (r->p >= r->end || *r->p != ':') {
                free(v->keys[v->n]);
                return r->err = "expected ':'", false;
            }
            r->p++;
        }
        v->n++;
        if (!parse_value(r, it))
            return false;
        skip_ws(r);
        if (r->p < r->end && *r->p == ',') {
            r->p++;
            continue;
        }
        if (r->p < r->end && *r->p == close) {
            r->p++;
            return true;
        }
        return r->err = obj ? "expected ',' or '}'" : "expected ',' or ']'", false;
    }
}

static bool parse_value(reader *r, json *v) {
    skip_ws(r);
    if (r->p >= r->end)
        return r->err = "unexpected end", false;
    if (++r->depth > 200)
        return r->err = "nested too deep", false;
    bool ok;
    switch (*r->p) {
    case '{':
        ok = parse_items(r, v, true);
        break;
    case '[':
        ok = parse_items(r, v, false);
        break;
    case '"':
        v->type = JSON_STR;
        ok      = parse_string(r, &v->str);
        break;
    case 't':
        v->type = JSON_BOOL;
        v->num  = 1;
        ok      = literal(r, "true");
        break;
    case 'f':
        v->type = JSON_BOOL;
        ok      = literal(r, "false");
        break;
    case 'n':
        v->type = JSON_NULL;
        ok      = literal(r, "null");
        break;
    default:
        ok = parse_number(r, v);
    }
    r->depth--;
    return ok;
}

static void free_inner(json *v) {
    for (int i = 0; i < v->n; i++) {
        free_inner(&v->items[i]);
        if (v->keys)
            free(v->keys[i]);
    }
    free(v->items);
    free(v->keys);
    free(v->str);
}

json *json_parse(const char *text, size_t len, const char **err) {
    reader r  = {.p = text, .end = text + len};
    json  *v  = calloc(1, sizeof *v);
    bool   ok = parse_value(&r, v);
    if (ok) {
        skip_ws(&r);
        if (r.p != r.end)
            ok = false, r.err = "trailing bytes after the value";
    }
    if (!ok) {
        if (err)
            *err = r.err;
        free_inner(v);
        free(v);
        return NULL;
    }
    return v;
}

void json_free(json *v) {
    if (v) {
        free_inner(v);
        free(v);
    }
}

const json *json_get(const json *v, const char *key) {
    if (!v || v->type != JSON_OBJ)
        return NULL;
    for (int i = 0; i < v->n; i++)
        if (strcmp(v->keys[i], key) == 0)
            return &v->items[i];
    return NULL;
}
