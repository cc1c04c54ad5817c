/* media-encode.h — encode frames to H.264 and mux with AAC audio (FFmpeg).
 *
 * Plain C module compiled into the encode stage and into tests; no
 * libspindle symbol. The container follows the file name (.mp4, .mkv,
 * .mov). Output is written to a temporary file beside the target
 * ("<path>.XXXXXX.part") and renamed onto the target only by a successful
 * spn_encoder_finish(); any failure, or spn_encoder_free() without finish,
 * removes the temporary file, so the target path never holds a half file.
 * Odd frame sizes are cropped to even (4:2:0 needs even sizes): the last
 * column/row is dropped. Every error message starts with the path.
 */
#ifndef SPN_MEDIA_ENCODE_H
#define SPN_MEDIA_ENCODE_H

#include <stdint.h>

#include "spindle/image.h"
#include "spindle/status.h"
#include "media-log.h"

typedef struct spn_encode_opts {
  const char *codec;        /* "libx264" (default), "h264_nvenc", or "auto" (NVENC if it opens) */
  int32_t crf;              /* constant quality (x264 crf / NVENC cq); default 23 */
  const char *preset;       /* encoder preset; default "medium" */
  int64_t bitrate;          /* bits/s; > 0 switches from CRF to average bitrate */
  int32_t fps_num, fps_den; /* nominal frame rate, any terms (the encoder reduces it); default 25/1 */
  int32_t faststart;        /* MP4/MOV: index at the front; default 1 */
  const char *audio_path;   /* mux (re-encoded to AAC) the audio of this file */
  int32_t audio_rate;       /* PCM given to spn_encoder_write_audio; 0 = none */
  int32_t audio_channels;
  int32_t audio_bitrate;    /* bit/s; 0 (default): 64 kbit/s per channel; capped at AAC's
                             * 6144 bits per channel per 1024 samples (96 kbit/s at 16 kHz mono) */
  int32_t rotation;         /* display rotation to record, degrees clockwise (0/90/180/270) */
  const spn_media_log_t *log; /* FFmpeg's messages for this file go here; borrowed, NULL: dropped */
  /* Encode from device frames: an FFmpeg CUDA device (AVBufferRef * of
   * AV_HWDEVICE_TYPE_CUDA, e.g. from spn_media_cuda_device_new); NULL: host
   * frames. With it, `codec` must take AV_PIX_FMT_CUDA frames (h264_nvenc,
   * hevc_nvenc): the encoder keeps a pool of NV12 frames on that device
   * (the even size, see above) and pictures go in through
   * spn_encoder_device_frame + spn_encoder_send_device_frame instead of
   * spn_encoder_write_video. Borrowed: the encoder takes its own reference. */
  void *hw_device;
  /* With audio_path: where in that file the soundtrack starts, seconds from
   * its stream's start (0: its start). The first video frame plays with
   * the sound at audio_start, as a job cut at `start` hears its soundtrack
   * from there. */
  double audio_start;
  /* With audio_path: 1 = a file with no audio stream gives a file without
   * sound (spn_encoder_has_audio says so); 0 (default): spn_encoder_new
   * refuses it ("no audio stream"). */
  int32_t audio_optional;
  /* The matrix and range of the file's 4:2:0 samples, recorded in the
   * stream (H.264/HEVC VUI: players read them instead of guessing): RGB and
   * float frames are converted with them; NV12/YUV420P frames are taken as
   * already in them (decode's, passed through). matrix 0: BT.601 limited,
   * spn_image_convert's (the default). An unknown matrix is refused. */
  spn_colour_t colour;
  /* H.273 colour primaries and transfer characteristics to record (a
   * source's, passed through with its samples); 0 or 2: not recorded. */
  int32_t primaries, transfer;
  /* The pixels' shape to record (sample aspect ratio; 0 or 1:1: square):
   * a source's, passed through with its stored frames (an anamorphic
   * video's 4:2:0 planes), so that players show it at its shape. */
  int32_t sar_num, sar_den;
  /* Where the 4:2:0 chroma samples sit, to record (H.273's
   * chroma_sample_loc_type + 1, FFmpeg's AVChromaLocation; 0: not said,
   * which readers take as MPEG-2's "left"). RGB and float frames are
   * converted here with chroma at the centre of each 2x2 block (swscale's
   * siting, as spn_image_convert's mean), so they are recorded
   * SPN_CHROMA_LOC_CENTER whatever this says; a caller that converted RGB
   * to the NV12/YUV420P frames it writes says so here. */
  int32_t chroma_loc;
} spn_encode_opts_t;

#define SPN_CHROMA_LOC_CENTER 2 /* AVCHROMA_LOC_CENTER: MPEG-1/JPEG's, the middle of the 2x2 block */

#define SPN_ENCODE_OPTS_INIT                                                                                        \
  {"libx264", 23, "medium", 0, 25, 1, 1, NULL, 0, 0, 0, 0, NULL, NULL, 0.0, 0, {0, 0}, 0, 0, 0, 0, 0}

typedef struct spn_encoder spn_encoder_t;

/* Create an encoder for frames of width x height in `pixfmt` (RGB24, BGR24,
 * NV12, YUV420P, RGBF32P/BGRF32P in [0, 255]; with opts->hw_device, NV12:
 * what the caller writes into the device frames). Ownership: caller owns *out.
 * Thread: any; one encoder is used by one thread at a time. */
int32_t spn_encoder_new(const char *path, int32_t width, int32_t height, int32_t pixfmt,
                        const spn_encode_opts_t *opts, spn_encoder_t **out, spn_error_t *err);

/* Whether an encoder could write `path`: a container its name picks, and a
 * temporary file that can be made beside it (made and removed here, as
 * spn_encoder_new will make it). Lets a job whose output can never be
 * written fail before its first frame, with the error spn_encoder_new
 * would give. Thread: any. */
int32_t spn_encoder_check_path(const char *path, spn_error_t *err);
/* Only the first of those checks: a container can be picked from the file
 * name. Nothing is created. Thread: any. */
int32_t spn_encoder_check_container(const char *path, spn_error_t *err);

/* Whether this FFmpeg has the video encoder `name` names ("auto" always
 * passes: it picks one of NVENC and libx264 per job). The stage checks its
 * codec when it is created, so a misspelt codec fails the pipeline's load,
 * not every job at its first frame. Thread: any. */
int32_t spn_encoder_check_codec(const char *name, spn_error_t *err);

/* Encode one frame shown at pts * tb_num / tb_den seconds (timestamps are
 * rebased so the first frame is at 0; non-increasing ones are bumped). */
int32_t spn_encoder_write_video(spn_encoder_t *enc, const spn_image_t *img, int64_t pts, int32_t tb_num,
                                int32_t tb_den, spn_error_t *err);

/* Encoders opened with hw_device: the next picture's NV12 planes, device
 * memory of the encoder's (even) size from its frame pool, as a view in
 * *nv12 (any row pitch; no `owned`). The caller fills them on the device's
 * stream and then calls spn_encoder_send_device_frame; the view is valid
 * until that call. Ownership: the encoder's. Thread: as write_video. */
int32_t spn_encoder_device_frame(spn_encoder_t *enc, spn_image_t *nv12, spn_error_t *err);

/* Encode the picture spn_encoder_device_frame handed out, shown at pts *
 * tb_num / tb_den seconds (as write_video). The work that filled it must
 * be queued on the CUDA device's stream (FFmpeg's NVENC reads the frame on
 * that stream) or finished. */
int32_t spn_encoder_send_device_frame(spn_encoder_t *enc, int64_t pts, int32_t tb_num, int32_t tb_den,
                                      spn_error_t *err);

/* The NVENC encoder that makes what `codec` names, for frames in device
 * memory: "h264_nvenc" for libx264, h264_nvenc and auto; "hevc_nvenc" for
 * libx265 and hevc_nvenc; NULL for any other codec (no NVENC encoder). */
const char *spn_encoder_nvenc_for(const char *codec);

/* Append interleaved float32 PCM (audio_rate, audio_channels of the opts). */
int32_t spn_encoder_write_audio(spn_encoder_t *enc, const float *samples, int64_t n_samples,
                                spn_error_t *err);

/* Flush, write the trailer, rename onto the target. On error the temporary
 * file is removed. Either way the encoder must then be freed. */
int32_t spn_encoder_finish(spn_encoder_t *enc, spn_error_t *err);

/* Free; removes the temporary file if finish did not succeed. */
void spn_encoder_free(spn_encoder_t *enc);

/* Whether the file gets a soundtrack (false: no audio_path or PCM, or an
 * audio_optional audio_path without sound). */
int32_t spn_encoder_has_audio(const spn_encoder_t *enc);

/* Name of the video encoder actually used ("libx264", "h264_nvenc"). */
const char *spn_encoder_codec_name(const spn_encoder_t *enc);

#endif
