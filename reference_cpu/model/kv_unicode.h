/**
 * @file kv_unicode.h
 * What the GGUF tokenizers need of Unicode: UTF-8 read and written the way llama.cpp does,
 * the codepoint classes of the pre-tokenizer patterns (`\p{L}`, `\p{N}`, `\p{P}`, `\s`), and
 * GPT-2's byte <-> character map of byte-level BPE.
 *
 * The classes come from a generated table (kv_unicode_table.c, written by
 * tools/unicode/gen_tables.py): runs of codepoints, ascending, found by binary search.
 */
#ifndef KV_UNICODE_H
#define KV_UNICODE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** Codepoint classes (bits of kv_unicode_class()). */
enum {
    KV_UC_LETTER = 1, /**< general category L*: `\p{L}` */
    KV_UC_NUMBER = 2, /**< general category N*: `\p{N}` */
    KV_UC_SPACE = 4,  /**< White_Space: `\s` */
    KV_UC_PUNCT = 8   /**< general category P*: `\p{P}` */
};

/** One run of the table: codepoints first..last (inclusive) have class cls. */
typedef struct {
    uint32_t first, last;
    uint8_t cls;
} kv_unicode_range;

extern const kv_unicode_range kv_unicode_ranges[]; /* [kv_unicode_n_ranges], ascending */
extern const int kv_unicode_n_ranges;
extern const char kv_unicode_version[]; /* the Unicode version the table was made from */

/** The class bits of @p cpt (0 for a codepoint in no class, or past U+10FFFF). */
int kv_unicode_class(uint32_t cpt);

/** U+FFFD, what an invalid UTF-8 byte reads as. */
#define KV_UNICODE_REPLACEMENT 0xFFFDu

/**
 * Read one codepoint at @p s (n > 0 bytes left) as llama.cpp's unicode_cpts_from_utf8() does:
 * a lead byte and its continuation bytes give the codepoint (overlong forms and surrogates
 * included, unchecked); a stray continuation byte, a lead byte 0xF8..0xFF, a sequence cut
 * short by the end or by a byte that is not a continuation read as U+FFFD and consume one
 * byte. A 4-byte form above U+10FFFF (llama.cpp throws there) reads as U+FFFD too.
 * Writes the bytes consumed to *used.
 */
uint32_t kv_utf8_read(const unsigned char *s, size_t n, int *used);
/** Write @p cpt (<= 0x10FFFF) as UTF-8 into out (4 bytes room); returns its length. */
int kv_utf8_write(uint32_t cpt, unsigned char *out);
/** Byte length of the sequence a lead byte announces, from its high nibble (1 for a stray
 * continuation byte): llama.cpp's unicode_len_utf8(), which splits text into symbols. */
int kv_utf8_len(unsigned char lead);

/** GPT-2's printable character for a byte (byte-level BPE). */
uint32_t kv_gpt2_byte_char(unsigned char byte);
/** The byte whose GPT-2 character is @p cpt, or -1 if none. */
int kv_gpt2_char_byte(uint32_t cpt);

#ifdef __cplusplus
}
#endif
#endif
