// Patched into llama.cpp's ggml/src/ggml-cpu/arch/x86/repack.cpp by tools/install_llama_cpp.py.
// Derived from llama.cpp's ggml_gemv_q4_K_8x8_q8_K (MIT License, the ggml authors): the same
// per-row instructions, reordered so that the weight work is shared between rows.
// verispec: nr rows of Q8_K activations against Q4_Kx8 weights, each row's arithmetic exactly
// ggml_gemv_q4_K_8x8_q8_K's (the same instructions in the same order per row), the weights of a
// super-block loaded and unpacked once for all rows instead of once per row. s: nr rows with a
// stride of bs floats; vy: nr rows of n / QK_K block_q8_K each, back to back.
void ggml_gemv_rows_q4_K_8x8_q8_K(int n, float * GGML_RESTRICT s, size_t bs, const void * GGML_RESTRICT vx, const void * GGML_RESTRICT vy, int nr, int nc) {
#if defined(__AVX2__)
    static const uint32_t kmask1 = 0x3f3f3f3f;
    static const uint32_t kmask2 = 0x0f0f0f0f;
    static const uint32_t kmask3 = 0x03030303;
    const int nb = n / QK_K;
    const __m128i deltamask = _mm_set_epi8(15, 14, 7, 6, 13, 12, 5, 4, 11, 10, 3, 2, 9, 8, 1, 0);
    const __m128i scalemask = _mm_set_epi8(7, 7, 3, 3, 6, 6, 2, 2, 5, 5, 1, 1, 4, 4, 0, 0);
    const __m256i finalpermutemask = _mm256_set_epi32(7, 5, 3, 1, 6, 4, 2, 0);
    const __m256i m4b = _mm256_set1_epi8(0x0F);
    const block_q4_Kx8 * b_ptr_start = (const block_q4_Kx8 *) vx;
    const block_q8_K * a_ptr_start = (const block_q8_K *) vy;
    enum { TILE = 16 };
    for (int y0 = 0; y0 < nr; y0 += TILE) {
        const int rows = nr - y0 < TILE ? nr - y0 : TILE;
        for (int64_t x = 0; x < nc / 8; x++) {
            const block_q4_Kx8 * b_ptr = b_ptr_start + (x * nb);
            __m256 acc_row[TILE], acc_min_rows[TILE];
            for (int y = 0; y < rows; y++) {
                acc_row[y] = _mm256_setzero_ps();
                acc_min_rows[y] = _mm256_setzero_ps();
            }
            for (int64_t b = 0; b < nb; b++) {
                const __m256 col_scale_f32 = GGML_F32Cx8_REARRANGE_LOAD(b_ptr[b].d, deltamask);
                const __m256 col_dmin_f32 = GGML_F32Cx8_LOAD(b_ptr[b].dmin);
                // the weight operands of the 16 maddubs per sub-block pair, its scales and mins
                __m256i w[QK_K / 64][16], scales_0[QK_K / 64], scales_1[QK_K / 64], mins_01[QK_K / 64];
                for (int sb = 0; sb < QK_K / 64; sb++) {
                    const uint8_t * q = b_ptr[b].qs + sb * 256;
                    for (int j = 0; j < 4; j++) {
                        const __m256i raw_0123 = _mm256_loadu_si256((const __m256i *)(q + 64 * j));
                        const __m256i raw_4567 = _mm256_loadu_si256((const __m256i *)(q + 32 + 64 * j));
                        const __m256i lo_0123 = _mm256_and_si256(raw_0123, m4b);
                        const __m256i lo_4567 = _mm256_and_si256(raw_4567, m4b);
                        const __m256i hi_0123 = _mm256_and_si256(_mm256_srli_epi16(raw_0123, 4), m4b);
                        const __m256i hi_4567 = _mm256_and_si256(_mm256_srli_epi16(raw_4567, 4), m4b);
                        w[sb][2 * j]         = _mm256_blend_epi32(lo_0123, _mm256_shuffle_epi32(lo_4567, 177), 170);
                        w[sb][2 * j + 1]     = _mm256_blend_epi32(_mm256_shuffle_epi32(lo_0123, 177), lo_4567, 170);
                        w[sb][8 + 2 * j]     = _mm256_blend_epi32(hi_0123, _mm256_shuffle_epi32(hi_4567, 177), 170);
                        w[sb][8 + 2 * j + 1] = _mm256_blend_epi32(_mm256_shuffle_epi32(hi_0123, 177), hi_4567, 170);
                    }
                    uint32_t utmp_0[4], utmp_1[4];
                    memcpy(utmp_0, b_ptr[b].scales + 24 * sb, 12);
                    utmp_0[3] = ((utmp_0[2] >> 4) & kmask2) | (((utmp_0[1] >> 6) & kmask3) << 4);
                    const uint32_t uaux_0 = utmp_0[1] & kmask1;
                    utmp_0[1] = (utmp_0[2] & kmask2) | (((utmp_0[0] >> 6) & kmask3) << 4);
                    utmp_0[2] = uaux_0;
                    utmp_0[0] &= kmask1;
                    memcpy(utmp_1, b_ptr[b].scales + 12 + sb * 24, 12);
                    utmp_1[3] = ((utmp_1[2] >> 4) & kmask2) | (((utmp_1[1] >> 6) & kmask3) << 4);
                    const uint32_t uaux_1 = utmp_1[1] & kmask1;
                    utmp_1[1] = (utmp_1[2] & kmask2) | (((utmp_1[0] >> 6) & kmask3) << 4);
                    utmp_1[2] = uaux_1;
                    utmp_1[0] &= kmask1;
                    const __m128i mins_and_scales_0 = _mm_set_epi32(utmp_0[3], utmp_0[2], utmp_0[1], utmp_0[0]);
                    scales_0[sb] = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(mins_and_scales_0, scalemask));
                    const __m128i mins_and_scales_1 = _mm_set_epi32(utmp_1[3], utmp_1[2], utmp_1[1], utmp_1[0]);
                    scales_1[sb] = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(mins_and_scales_1, scalemask));
                    mins_01[sb] = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(_mm_shuffle_epi32(mins_and_scales_0, 78), _mm_shuffle_epi32(mins_and_scales_1, 78)));
                }
                for (int y = 0; y < rows; y++) {
                    const block_q8_K * a_ptr = a_ptr_start + ((y0 + y) * nb);
                    const __m256 row_scale_f32 = _mm256_set1_ps((a_ptr[b].d));
                    __m256i iacc_b = _mm256_setzero_si256();
                    __m256i iacc_min_b = _mm256_setzero_si256();
                    const __m256i q8sums = _mm256_loadu_si256((const __m256i *)(a_ptr[b].bsums));
                    __m256i q8s = _mm256_castsi128_si256(_mm_hadd_epi16(_mm256_castsi256_si128(q8sums), _mm256_extracti128_si256(q8sums, 1)));
                    q8s = _mm256_permute2f128_si256(q8s, q8s, 0);
                    for (int sb = 0; sb < QK_K / 64; sb++) {
                        __m256i lhs_vec_00 = _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(a_ptr[b].qs + sb * 64)));
                        __m256i lhs_vec_01 = _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(a_ptr[b].qs + 16 + sb * 64)));
                        __m256i lhs_vec_10 = _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(a_ptr[b].qs + 32 + sb * 64)));
                        __m256i lhs_vec_11 = _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(a_ptr[b].qs + 48 + sb * 64)));
                        lhs_vec_00 = _mm256_permute2f128_si256(lhs_vec_00, lhs_vec_00, 0);
                        lhs_vec_01 = _mm256_permute2f128_si256(lhs_vec_01, lhs_vec_01, 0);
                        lhs_vec_10 = _mm256_permute2f128_si256(lhs_vec_10, lhs_vec_10, 0);
                        lhs_vec_11 = _mm256_permute2f128_si256(lhs_vec_11, lhs_vec_11, 0);
                        const __m256i * ws = w[sb];
                        __m256i iacc_0 = _mm256_setzero_si256();
                        __m256i iacc_1 = _mm256_setzero_si256();
                        iacc_0 = _mm256_add_epi16(iacc_0, _mm256_maddubs_epi16(ws[0], _mm256_shuffle_epi32(lhs_vec_00, 0)));
                        iacc_0 = _mm256_add_epi16(iacc_0, _mm256_maddubs_epi16(ws[1], _mm256_shuffle_epi32(lhs_vec_00, 85)));
                        iacc_0 = _mm256_add_epi16(iacc_0, _mm256_maddubs_epi16(ws[2], _mm256_shuffle_epi32(lhs_vec_00, 170)));
                        iacc_0 = _mm256_add_epi16(iacc_0, _mm256_maddubs_epi16(ws[3], _mm256_shuffle_epi32(lhs_vec_00, 255)));
                        iacc_0 = _mm256_add_epi16(iacc_0, _mm256_maddubs_epi16(ws[4], _mm256_shuffle_epi32(lhs_vec_01, 0)));
                        iacc_0 = _mm256_add_epi16(iacc_0, _mm256_maddubs_epi16(ws[5], _mm256_shuffle_epi32(lhs_vec_01, 85)));
                        iacc_0 = _mm256_add_epi16(iacc_0, _mm256_maddubs_epi16(ws[6], _mm256_shuffle_epi32(lhs_vec_01, 170)));
                        iacc_0 = _mm256_add_epi16(iacc_0, _mm256_maddubs_epi16(ws[7], _mm256_shuffle_epi32(lhs_vec_01, 255)));
                        iacc_0 = _mm256_madd_epi16(iacc_0, scales_0[sb]);
                        iacc_1 = _mm256_add_epi16(iacc_1, _mm256_maddubs_epi16(ws[8], _mm256_shuffle_epi32(lhs_vec_10, 0)));
                        iacc_1 = _mm256_add_epi16(iacc_1, _mm256_maddubs_epi16(ws[9], _mm256_shuffle_epi32(lhs_vec_10, 85)));
                        iacc_1 = _mm256_add_epi16(iacc_1, _mm256_maddubs_epi16(ws[10], _mm256_shuffle_epi32(lhs_vec_10, 170)));
                        iacc_1 = _mm256_add_epi16(iacc_1, _mm256_maddubs_epi16(ws[11], _mm256_shuffle_epi32(lhs_vec_10, 255)));
                        iacc_1 = _mm256_add_epi16(iacc_1, _mm256_maddubs_epi16(ws[12], _mm256_shuffle_epi32(lhs_vec_11, 0)));
                        iacc_1 = _mm256_add_epi16(iacc_1, _mm256_maddubs_epi16(ws[13], _mm256_shuffle_epi32(lhs_vec_11, 85)));
                        iacc_1 = _mm256_add_epi16(iacc_1, _mm256_maddubs_epi16(ws[14], _mm256_shuffle_epi32(lhs_vec_11, 170)));
                        iacc_1 = _mm256_add_epi16(iacc_1, _mm256_maddubs_epi16(ws[15], _mm256_shuffle_epi32(lhs_vec_11, 255)));
                        iacc_1 = _mm256_madd_epi16(iacc_1, scales_1[sb]);
                        const __m256i iacc_sb = _mm256_add_epi32(iacc_0, iacc_1);
                        const __m256i q8s_sb = _mm256_shuffle_epi32(q8s, 0);
                        const __m256i iacc_min_sb = _mm256_madd_epi16(q8s_sb, mins_01[sb]);
                        q8s = _mm256_bsrli_epi128(q8s, 4);
                        iacc_b = _mm256_add_epi32(iacc_b, iacc_sb);
                        iacc_min_b = _mm256_add_epi32(iacc_min_b, iacc_min_sb);
                    }
                    acc_row[y] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(iacc_b), _mm256_mul_ps(col_scale_f32, row_scale_f32), acc_row[y]);
                    acc_min_rows[y] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(iacc_min_b), _mm256_mul_ps(col_dmin_f32, row_scale_f32), acc_min_rows[y]);
                }
            }
            for (int y = 0; y < rows; y++) {
                const __m256 out = _mm256_permutevar8x32_ps(acc_row[y], finalpermutemask);
                _mm256_storeu_ps(s + (y0 + y) * bs + x * 8, _mm256_sub_ps(out, acc_min_rows[y]));
            }
        }
    }
#else
    for (int y = 0; y < nr; y++) {
        ggml_gemv_q4_K_8x8_q8_K(n, s + y * bs, bs, vx, (const block_q8_K *) vy + y * (n / QK_K), 1, nc);
    }
#endif
}

