/*
 * Chat templates recognised from their Jinja text (kv_chat_template_parse(), kv_chat.h),
 * without a model: the family, the default system message a ChatML template writes when the
 * first message is not a system one, and the refusal of any other template by name.
 *
 * The template texts are the published ones: SmolLM2-135M-Instruct's as its GGUF file carries
 * it (tokenizer.chat_template, byte for byte), ChatML without a default (llama.cpp's
 * tests/test-chat-template.cpp), Qwen2.5's default in an else branch (shortened to its
 * system-message part), Llama 3's, and Mistral's [INST] (refused). The expected default texts
 * are read off those templates by eye, not by kvlab.
 */
#include <string.h>

#include "kv_chat.h"
#include "common/kv_test.h"

static const char smollm2[] =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}";

static const char chatml[] =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}";

/* Qwen2.5's system part: the default inside an else branch, written with \n escapes */
static const char qwen[] =
    "{%- if messages[0]['role'] == 'system' %}\n"
    "        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
    "    {%- else %}\n"
    "        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
    "assistant.<|im_end|>\\n' }}\n"
    "    {%- endif %}";

static const char llama3[] =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | "
    "trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}"
    "{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";

static const char mistral[] =
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
    "{{ '[INST] ' + message['content'] + ' [/INST]' }}{% endif %}{% endfor %}";

static void check_parse(const char *name, const char *tpl, int format, const char *system)
{
    kv_chat_template t;
    kv_err err = {{0}};
    const int st = kv_chat_template_parse(tpl, strlen(tpl), NULL, &t, &err);
    KV_CHECK(st == KV_OK, "%s: status %d (%s)", name, st, err.msg);
    if (st) return;
    KV_CHECK(t.format == format, "%s: format %s, expected %s", name,
             kv_chat_format_name(t.format), kv_chat_format_name(format));
    KV_CHECK(strcmp(t.default_system, system) == 0, "%s: default system '%s', expected '%s'", name,
             t.default_system, system);
}

static void check_refused(const char *name, const char *tpl, size_t len, const char *begins)
{
    kv_chat_template t;
    kv_err err = {{0}};
    const int st = kv_chat_template_parse(tpl, len, NULL, &t, &err);
    KV_CHECK(st == KV_ERR_UNSUPPORTED, "%s: status %d, expected KV_ERR_UNSUPPORTED", name, st);
    KV_CHECK(strstr(err.msg, "chat template not recognised (kvlab knows ChatML and Llama 3); "
                             "the template begins: ") != NULL,
             "%s: message '%s'", name, err.msg);
    KV_CHECK(strstr(err.msg, begins) != NULL, "%s: message lacks '%s': %s", name, begins, err.msg);
    KV_CHECK(strchr(err.msg, '\n') == NULL, "%s: message spans lines: %s", name, err.msg);
}

int main(void)
{
    check_parse("SmolLM2", smollm2, KV_CHAT_CHATML,
                "You are a helpful AI assistant named SmolLM, trained by Hugging Face");
    check_parse("ChatML", chatml, KV_CHAT_CHATML, "");
    check_parse("Qwen2.5", qwen, KV_CHAT_CHATML,
                "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.");
    check_parse("Llama 3", llama3, KV_CHAT_LLAMA3, "");
    check_refused("Mistral", mistral, strlen(mistral), "{{ bos_token }}{% for message in");
    check_refused("empty", "", 0, "(empty)");
    /* a newline in the first 60 bytes is shown as \n: the message stays one line */
    check_refused("two lines", "{{ a }}\n{{ b }}", 15, "{{ a }}\\n{{ b }}");
    /* only the bytes given are read: a ChatML marker past len is not seen */
    check_refused("cut", smollm2, 20, "{% for message in me");
    return kv_test_finish();
}
