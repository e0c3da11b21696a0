// json.h: a small strict JSON reader for tests that check files dtrain writes (traces).
// Parses the whole text into a tree; rejects trailing garbage, bad escapes, bad numbers.
#ifndef DTRAIN_TESTS_JSON_H
#define DTRAIN_TESTS_JSON_H

#include <stdbool.h>
#include <stddef.h>

typedef enum { JSON_NULL, JSON_BOOL, JSON_NUM, JSON_STR, JSON_ARR, JSON_OBJ } json_type;

typedef struct json {
    json_type    type;
    double       num; // JSON_NUM; JSON_BOOL: 0 or 1
    char        *str; // JSON_STR (decoded, \u escapes below 0x80 only kept as bytes)
    int          n;   // JSON_ARR, JSON_OBJ: number of items
    struct json *items;
    char       **keys; // JSON_OBJ
} json;

// NULL on a syntax error (and *err, when given, says where).
json *json_parse(const char *text, size_t len, const char **err);
void  json_free(json *v);
// The member named key of an object; NULL when absent or v is not an object.
const json *json_get(const json *v, const char *key);

#endif // DTRAIN_TESTS_JSON_H
