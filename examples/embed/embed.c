/* The smallest embedding of specula: plain C, the public header only.
 * Usage: specula-embed-example model.gguf "prompt" */
#include <stdio.h>
#include <string.h>

#include "specula.h"

#define CHECK(call)                                                              \
    do {                                                                         \
        specula_status s_ = (call);                                              \
        if (s_ != SPECULA_OK) {                                                  \
            fprintf(stderr, "%s failed: %s (%s)\n", #call, specula_last_error(), \
                    specula_status_name(s_));                                    \
            goto done;                                                           \
        }                                                                        \
    } while (0)

int main(int argc, char** argv) {
    specula_backend* backend = NULL;
    specula_model* model = NULL;
    specula_session* session = NULL;
    int32_t tokens[256];
    size_t n_tokens = 0, n_out = 0, i;
    int rc = 1;
    if (argc < 3) {
        fprintf(stderr, "usage: %s model.gguf prompt\n", argv[0]);
        return 2;
    }
    specula_backend_params bp = specula_backend_default_params();
    specula_session_params sp = specula_session_default_params();
    specula_generate_params gp = specula_generate_default_params();
    sp.temperature = 0.0f; /* greedy */
    sp.n_ctx = 256;
    gp.max_tokens = 16;
    gp.stop_at_eos = false;

    CHECK(specula_backend_create(&bp, &backend));
    CHECK(specula_model_load(backend, argv[1], NULL, &model));
    CHECK(specula_session_create(model, &sp, &session));
    CHECK(specula_tokenize(model, argv[2], strlen(argv[2]), true, tokens, 256, &n_tokens));
    CHECK(specula_session_eval(session, tokens, n_tokens));
    CHECK(specula_generate(session, &gp, tokens, 256, &n_out));
    printf("generated %zu tokens:", n_out);
    for (i = 0; i < n_out; ++i)
        printf(" %d", tokens[i]);
    printf("\n");
    rc = 0;
done:
    specula_session_free(session);
    specula_model_free(model);
    specula_backend_free(backend);
    return rc;
}
