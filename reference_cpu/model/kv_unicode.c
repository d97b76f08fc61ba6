/*
 * UTF-8, codepoint classes and GPT-2's byte map (kv_unicode.h), written to give what
 * llama.cpp's unicode.cpp gives, since the GGUF tokenizers promise its ids.
 */
#include "kv_unicode.h"

int kv_unicode_class(uint32_t cpt)
{
    /* binary search for the last run starting at or before cpt */
    int lo = 0, hi = kv_unicode_n_ranges - 1, found = -1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        if (kv_unicode_ranges[mid].first <= cpt) {
            found = mid;
            lo = mid + 1;
        } else {
            hi = mid - 1;
        }
    }
    if (found < 0 || cpt > kv_unicode_ranges[found].last) return 0;
    return kv_unicode_ranges[found].cls;
}

static int is_cont(unsigned char c) { return (c & 0xC0) == 0x80; }

uint32_t kv_utf8_read(const unsigned char *s, size_t n, int *used)
{
    unsigned char c = s[0];
    uint32_t cpt;
    int len;
    *used = 1;
    if (c < 0x80) return c;
    if (!(c & 0x40)) return KV_UNICODE_REPLACEMENT;       /* 10xxxxxx: a stray continuation */
    if (!(c & 0x20)) len = 2, cpt = c & 0x1Fu;            /* 110xxxxx */
    else if (!(c & 0x10)) len = 3, cpt = c & 0x0Fu;       /* 1110xxxx */
    else if (!(c & 0x08)) len = 4, cpt = c & 0x07u;       /* 11110xxx */
    else return KV_UNICODE_REPLACEMENT;                   /* 11111xxx: no such lead byte */
    if ((size_t)len > n) return KV_UNICODE_REPLACEMENT;   /* cut short by the end */
    for (int i = 1; i < len; i++) {
        if (!is_cont(s[i])) return KV_UNICODE_REPLACEMENT;
        cpt = (cpt << 6) | (s[i] & 0x3Fu);
    }
    if (cpt > 0x10FFFF) return KV_UNICODE_REPLACEMENT;    /* F5..F7: past Unicode */
    *used = len;
    return cpt;
}

int kv_utf8_write(uint32_t cpt, unsigned char *out)
{
    if (cpt <= 0x7F) {
        out[0] = (unsigned char)cpt;
        return 1;
    }
    if (cpt <= 0x7FF) {
        out[0] = (unsigned char)(0xC0 | (cpt >> 6));
        out[1] = (unsigned char)(0x80 | (cpt & 0x3F));
        return 2;
    }
    if (cpt <= 0xFFFF) {
        out[0] = (unsigned char)(0xE0 | (cpt >> 12));
        out[1] = (unsigned char)(0x80 | ((cpt >> 6) & 0x3F));
        out[2] = (unsigned char)(0x80 | (cpt & 0x3F));
        return 3;
    }
    out[0] = (unsigned char)(0xF0 | (cpt >> 18));
    out[1] = (unsigned char)(0x80 | ((cpt >> 12) & 0x3F));
    out[2] = (unsigned char)(0x80 | ((cpt >> 6) & 0x3F));
    out[3] = (unsigned char)(0x80 | (cpt & 0x3F));
    return 4;
}

int kv_utf8_len(unsigned char lead)
{
    static const int by_nibble[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return by_nibble[lead >> 4];
}

/*
 * GPT-2's byte-level BPE never sees a raw byte: each byte is a printable character, so that
 * every token is readable text. The printable bytes '!'..'~', 0xA1..0xAC and 0xAE..0xFF stand
 * for themselves; the other 68 (controls, space, 0x7F..0xA0, the soft hyphen 0xAD) take
 * U+0100, U+0101, ... in byte order. A space is thus U+0120 'Ġ' and a newline U+010A 'Ċ'.
 */
static int printable(unsigned b)
{
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

uint32_t kv_gpt2_byte_char(unsigned char byte)
{
    if (printable(byte)) return byte;
    uint32_t n = 0; /* the bytes before this one that are not printable */
    for (unsigned b = 0; b < byte; b++) n += !printable(b);
    return 256 + n;
}

int kv_gpt2_char_byte(uint32_t cpt)
{
    if (cpt < 256) return printable(cpt) ? (int)cpt : -1;
    uint32_t n = 256;
    for (unsigned b = 0; b < 256; b++) {
        if (printable(b)) continue;
        if (n++ == cpt) return (int)b;
    }
    return -1;
}
