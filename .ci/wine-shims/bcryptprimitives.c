/* Wine 8.0 has no bcryptprimitives.dll; Rust >= 1.78's standard library imports its
 * ProcessPrng (pydantic-core, orjson). This one forwards to BCryptGenRandom with the
 * system-preferred RNG, which is what Windows' own ProcessPrng draws from. */
#include <windows.h>
#include <bcrypt.h>

BOOL WINAPI ProcessPrng(PBYTE data, SIZE_T len)
{
    while (len > 0) {
        ULONG chunk = len > 0x7fffffff ? 0x7fffffff : (ULONG)len;
        if (BCryptGenRandom(NULL, data, chunk, BCRYPT_USE_SYSTEM_PREFERRED_RNG) != 0)
            return FALSE;
        data += chunk;
        len -= chunk;
    }
    return TRUE;
}
