/* Wine 8.0 has no Windows 10 system ICU (icuuc.dll), which PySide6 6.12's Qt6Core imports for
 * its text codecs (ucnv_* only). Here no converter ever opens: ucnv_open fails and there are
 * no converters to list, so Qt falls back to its built-in codecs (UTF-8, UTF-16, Latin-1), all
 * that rbroker's tray uses. The other functions are never reached without an open converter;
 * each fails safely anyway. Signatures after ICU's ucnv.h (UErrorCode is an int; 4 is
 * U_FILE_ACCESS_ERROR). */
#include <stddef.h>
#include <stdint.h>

#define U_FILE_ACCESS_ERROR 4
#define EXPORT __declspec(dllexport)

static void fail(int *err) { if (err && *err <= 0) *err = U_FILE_ACCESS_ERROR; }

EXPORT void *ucnv_open(const char *name, int *err) { (void)name; fail(err); return NULL; }
EXPORT void ucnv_close(void *cnv) { (void)cnv; }
EXPORT void ucnv_reset(void *cnv) { (void)cnv; }
EXPORT int8_t ucnv_getMaxCharSize(const void *cnv) { (void)cnv; return 1; }
EXPORT const char *ucnv_getName(const void *cnv, int *err) { (void)cnv; fail(err); return NULL; }
EXPORT void ucnv_getToUCallBack(const void *cnv, void **action, const void **ctx)
{ (void)cnv; if (action) *action = NULL; if (ctx) *ctx = NULL; }
EXPORT void ucnv_getFromUCallBack(const void *cnv, void **action, const void **ctx)
{ (void)cnv; if (action) *action = NULL; if (ctx) *ctx = NULL; }
EXPORT void ucnv_setToUCallBack(void *cnv, void *a, const void *c, void **oa, const void **oc, int *err)
{ (void)cnv; (void)a; (void)c; (void)oa; (void)oc; fail(err); }
EXPORT void ucnv_setFromUCallBack(void *cnv, void *a, const void *c, void **oa, const void **oc, int *err)
{ (void)cnv; (void)a; (void)c; (void)oa; (void)oc; fail(err); }
EXPORT void UCNV_FROM_U_CALLBACK_SUBSTITUTE(const void *c, void *a, const void *cu, int32_t l,
                                            int32_t cp, int r, int *err)
{ (void)c; (void)a; (void)cu; (void)l; (void)cp; (void)r; fail(err); }
EXPORT void UCNV_TO_U_CALLBACK_SUBSTITUTE(const void *c, void *a, const char *cb, int32_t l,
                                          int r, int *err)
{ (void)c; (void)a; (void)cb; (void)l; (void)r; fail(err); }
EXPORT void ucnv_cbToUWriteUChars(void *a, const void *s, int32_t l, int32_t o, int *err)
{ (void)a; (void)s; (void)l; (void)o; fail(err); }
EXPORT void ucnv_cbFromUWriteUChars(void *a, const void **s, const void *e, int32_t o, int *err)
{ (void)a; (void)s; (void)e; (void)o; fail(err); }
EXPORT void ucnv_toUnicode(void *cnv, void **t, const void *tl, const char **s, const char *sl,
                           int32_t *o, int8_t f, int *err)
{ (void)cnv; (void)t; (void)tl; (void)s; (void)sl; (void)o; (void)f; fail(err); }
EXPORT void ucnv_fromUnicode(void *cnv, char **t, const char *tl, const void **s, const void *sl,
                             int32_t *o, int8_t f, int *err)
{ (void)cnv; (void)t; (void)tl; (void)s; (void)sl; (void)o; (void)f; fail(err); }
EXPORT int32_t ucnv_toUCountPending(const void *cnv, int *err) { (void)cnv; fail(err); return 0; }
EXPORT int32_t ucnv_fromUCountPending(const void *cnv, int *err) { (void)cnv; fail(err); return 0; }
EXPORT const char *ucnv_getStandardName(const char *n, const char *s, int *err)
{ (void)n; (void)s; fail(err); return NULL; }
EXPORT const char *ucnv_getAvailableName(int32_t n) { (void)n; return NULL; }
EXPORT int32_t ucnv_countAvailable(void) { return 0; }
